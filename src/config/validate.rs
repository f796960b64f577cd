//! Raw model -> validated `Config` (stub until the config work lands).
use super::*;

pub(super) fn parse(_text: &str, path: &Path) -> Result<Config, ConfigError> {
    Err(ConfigError {
        diagnostics: vec![Diagnostic {
            file: path.to_path_buf(),
            position: None,
            path: None,
            message: "config parsing not implemented yet".into(),
        }],
    })
}
