//! End-to-end proof with real Debian puppetserver 7 and puppet agents through
//! crossbar (tests/puppet/run.sh). Needs root, apt, ~2 GiB RAM and ~6 minutes,
//! so it only runs when asked:
//!
//!     CROSSBAR_PUPPET_E2E=1 cargo test --release --test puppet_e2e -- --nocapture

use std::process::Command;

#[test]
fn puppet_end_to_end() {
    if std::env::var("CROSSBAR_PUPPET_E2E").as_deref() != Ok("1") {
        eprintln!("skipped: set CROSSBAR_PUPPET_E2E=1 to run tests/puppet/run.sh");
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let status = Command::new("bash")
        .arg(format!("{root}/tests/puppet/run.sh"))
        .env("CROSSBAR_BIN", env!("CARGO_BIN_EXE_crossbar"))
        .status()
        .expect("run tests/puppet/run.sh");
    assert!(status.success(), "tests/puppet/run.sh failed: {status}");
}
