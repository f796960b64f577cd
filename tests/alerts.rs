//! The shipped alerting rules, evaluated by Prometheus's own `promtool`: each new
//! alert fires when it should (the reload alert on the FIRST failed reload) and not
//! before; the dashboard selects an instance. Without promtool the test fails
//! (tests/run.sh installs it).
use std::path::Path;
use std::process::Command;

fn promtool(args: &[&str]) -> std::process::Output {
    match Command::new("promtool").args(args).output() {
        Ok(out) => out,
        Err(e) => crossbar::testbed::missing_tool(
            "alert rule tests",
            &format!("promtool did not run: {e} (apt-get install prometheus)"),
        ),
    }
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = root.join("docs/prometheus-alerts.yaml");
    let check = promtool(&["check", "rules", rules.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(
        check.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let tests = root.join("tests/alerts/prometheus-alerts.test.yaml");
    let run = promtool(&["test", "rules", tests.to_str().unwrap()]);
    let out =
        String::from_utf8_lossy(&run.stdout).into_owned() + &String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn the_dashboard_has_an_instance_variable_used_by_every_query() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let vars = dash["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter().any(|v| v["name"] == "instance"),
        "no instance variable"
    );
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap_or_default().to_string());
        }
    }
    assert!(!exprs.is_empty());
    for e in exprs {
        // Every metric selector is scoped to the chosen instances.
        let selectors = e.matches("crossbar_").count() + e.matches("process_").count();
        let scoped = e.matches("instance=~\"$instance\"").count();
        assert_eq!(selectors, scoped, "unscoped selector in: {e}");
    }
}
