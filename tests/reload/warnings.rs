//! Settings a reload accepts but names in a warning: the retired `relay: kernel`
//! (served as splice-auto, warned at start and at every reload) and the settings
//! only a start reads (`workers`, the admin address), which wait for a restart.
use crate::common::*;
use crate::reload_done;

/// An operator upgrades crossbar with a config that still names the retired
/// `relay: kernel`: the process starts and serves (with splice-auto), says so in a
/// warning at `file:line:col`, and a SIGHUP reload of that same file succeeds and
/// warns again; neither a start nor a reload is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retired_relay_kernel_starts_and_reloads_with_a_warning() {
    let (_echo, dir, listen, cfg) = echo_service("    relay: kernel\n").await;
    let admin = enable_admin(&cfg);
    let (p, log_path) = run_logged(&cfg, dir.path(), listen, admin).await;
    let warning = format!(
        "{}:8:12: services.svc.relay: warning: `kernel` was retired",
        cfg.display()
    );
    let warnings = || {
        let text = std::fs::read_to_string(&log_path).unwrap();
        text.matches(&warning).count()
    };
    // Log lines reach stderr through the writer thread: wait for it, not for a time.
    wait_until_async("the start warning is written", || {
        let n = warnings();
        async move { n == 1 }
    })
    .await;
    ping(listen)
        .await
        .expect("served with the retired relay named");

    reload_done(&p, admin).await;
    wait_until_async("the reload warns again", || {
        let n = warnings();
        async move { n == 2 }
    })
    .await;
    ping(listen).await.expect("served after the reload");
    terminate(p).await;
}

/// A reload that changes what only a start reads (`workers`, the admin address)
/// applies the rest and names each of those in a warning; the admin endpoint stays
/// where it was bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_names_the_settings_only_a_restart_applies() {
    let (_echo, dir, listen, cfg) = echo_service("").await;
    let admin = enable_admin(&cfg);
    let (p, log_path) = run_logged(&cfg, dir.path(), listen, admin).await;
    let moved = free_port();
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    let yaml = yaml.replace(&admin.to_string(), &moved.to_string());
    std::fs::write(&cfg, format!("workers: 1\n{yaml}")).unwrap();
    reload_done(&p, admin).await;
    let workers = "`workers` changed from one per core to 1: the runtime keeps its threads until a restart or upgrade";
    let endpoint = format!("`admin` changed from {admin} to {moved}: the admin endpoint stays");
    let logged = |s: &str| std::fs::read_to_string(&log_path).unwrap().contains(s);
    wait_until_async("both warnings are written", || {
        let both = logged(workers) && logged(&endpoint);
        async move { both }
    })
    .await;
    admin_get(admin, "/healthz").await; // the admin endpoint stays where it was
    ping(listen).await.expect("served after the reload");
    terminate(p).await;
}
