//! `crossbar demo` (in progress).
/// Run the demo.
pub async fn run(_serve: bool) -> anyhow::Result<()> {
    Ok(())
}
