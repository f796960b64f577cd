//! Configuration errors that read `file:line:col: path: message`.
use std::path::{Path, PathBuf};

/// One problem found in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file.
    pub file: PathBuf,
    /// 1-based line and column, when known.
    pub position: Option<(usize, usize)>,
    /// YAML path such as `services.puppet.backends[2].address`, when known.
    pub path: Option<String>,
    /// What is wrong, for a human.
    pub message: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((l, c)) = self.position {
            write!(f, ":{l}:{c}")?;
        }
        write!(f, ": ")?;
        if let Some(p) = &self.path {
            write!(f, "{p}: ")?;
        }
        write!(f, "{}", self.message)
    }
}

/// All problems found in a configuration file (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The problems, in file order.
    pub diagnostics: Vec<Diagnostic>,
}

impl ConfigError {
    pub(crate) fn io(path: &Path, e: std::io::Error) -> ConfigError {
        ConfigError {
            diagnostics: vec![Diagnostic {
                file: path.to_path_buf(),
                position: None,
                path: None,
                message: format!("cannot read: {e}"),
            }],
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
