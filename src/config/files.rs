//! `crossbar check` opens what the config names: token file, CA and client
//! certificate files, state-file directories, and reports each problem at the line
//! that names the file.
//!
//! Validation proper (`validate.rs`) stays pure, so a config can be checked on a
//! machine that lacks these files (`check --config-only`); this pass runs where
//! crossbar will run, as the user it runs as, and catches what would otherwise fail
//! at start, at the first health check or at the first table save.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::position::PositionIndex;
use super::{ConfigError, Diagnostic};

/// Permission bits for "others": a secret must have none of them.
const WORLD_BITS: u32 = 0o007;

/// The config keys that name files, and how each file is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKind {
    /// `admin.token_file`: readable, non-empty, no permissions for others.
    Token,
    /// `health.ca_file`, `health.client_cert`: PEM with at least one certificate.
    Certificates,
    /// `health.client_key`: a PEM private key; no permissions for others.
    PrivateKey,
    /// `stick.state_file`: its directory exists and is writable.
    StateFile,
}

impl FileKind {
    fn of_key(key: &str) -> Option<FileKind> {
        Some(match key {
            "token_file" => FileKind::Token,
            "ca_file" | "client_cert" => FileKind::Certificates,
            "client_key" => FileKind::PrivateKey,
            "state_file" => FileKind::StateFile,
            _ => return None,
        })
    }
}

/// One file named in the config: where (YAML path) and what.
#[derive(Debug)]
struct Named {
    yaml_path: String,
    kind: FileKind,
    file: PathBuf,
}

/// Check every file `text` names; `file` is the config's own path (for messages
/// and to resolve nothing: paths in the config are used as written).
pub(super) fn check(text: &str, file: &Path) -> Result<(), ConfigError> {
    let index = PositionIndex::build(text);
    let Some(doc) = super::problems::tolerant_value(text, &index) else {
        return Ok(()); // validation already reported why; nothing to open
    };
    let mut named = Vec::new();
    collect(&doc, "", &mut named);
    let diagnostics: Vec<Diagnostic> = named
        .iter()
        .filter_map(|n| {
            let message = problem(n.kind, &n.file)?;
            Some(Diagnostic {
                file: file.to_path_buf(),
                position: index.at(&n.yaml_path),
                path: Some(n.yaml_path.clone()),
                message,
            })
        })
        .collect();
    if diagnostics.is_empty() {
        Ok(())
    } else {
        Err(ConfigError { diagnostics })
    }
}

/// Walk the document, collecting every key that names a file (in file order).
fn collect(v: &serde_yaml::Value, path: &str, out: &mut Vec<Named>) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            for (k, child) in m {
                let Some(key) = k.as_str() else { continue };
                let child_path = if path.is_empty() {
                    key.to_string()
                } else {
                    format!("{path}.{key}")
                };
                match (FileKind::of_key(key), child.as_str()) {
                    (Some(kind), Some(f)) => out.push(Named {
                        yaml_path: child_path,
                        kind,
                        file: PathBuf::from(f),
                    }),
                    _ => collect(child, &child_path, out),
                }
            }
        }
        serde_yaml::Value::Sequence(items) => {
            for (i, child) in items.iter().enumerate() {
                collect(child, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// What is wrong with `file` for its use, or None.
fn problem(kind: FileKind, file: &Path) -> Option<String> {
    let shown = file.display();
    match kind {
        FileKind::Token => {
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) => return Some(format!("cannot read {shown}: {e}")),
            };
            if text.trim().is_empty() {
                return Some(format!("{shown} is empty: write the admin token into it"));
            }
            private(file)
        }
        FileKind::Certificates => {
            let certs = CertificateDer::pem_file_iter(file)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>());
            match certs {
                Err(e) => Some(format!("cannot read {shown} as PEM certificates: {e}")),
                Ok(c) if c.is_empty() => Some(format!(
                    "{shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
                )),
                Ok(_) => None,
            }
        }
        FileKind::PrivateKey => match PrivateKeyDer::from_pem_file(file) {
            Err(e) => Some(format!("cannot read {shown} as a PEM private key: {e}")),
            Ok(_) => private(file),
        },
        FileKind::StateFile => state_dir_problem(file),
    }
}

/// A secret file must not be readable by every user.
fn private(file: &Path) -> Option<String> {
    let mode = std::fs::metadata(file).ok()?.permissions().mode();
    (mode & WORLD_BITS != 0).then(|| {
        format!(
            "{} is readable by every user (mode {:o}): chmod o-rwx it",
            file.display(),
            mode & 0o777
        )
    })
}

/// What a file that is not a regular file is, for messages ("a FIFO").
pub(crate) fn describe_file_type(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "not a file"
    }
}

/// The state file's directory must exist and take a new file (crossbar writes a
/// temporary file there and renames it over the state file).
fn state_dir_problem(file: &Path) -> Option<String> {
    // An existing path must be a regular file: crossbar never reads anything else
    // back (a FIFO would block the read), so what is there would be lost.
    if let Ok(meta) = std::fs::symlink_metadata(file) {
        let kind = meta.file_type();
        if !kind.is_file() {
            return Some(format!(
                "{} is {}, not a regular file: crossbar reads the table back only from a regular file",
                file.display(),
                describe_file_type(&kind)
            ));
        }
    }
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Some(format!("directory {} does not exist", dir.display()));
    }
    let probe = dir.join(format!(".crossbar-check-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            if let Err(e) = std::fs::remove_file(&probe) {
                return Some(format!("cannot remove {}: {e}", probe.display()));
            }
            None
        }
        Err(e) => Some(format!(
            "cannot create files in {} (the state file is saved there): {e}",
            dir.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(text: &str) -> Vec<String> {
        match check(text, Path::new("c.yaml")) {
            Ok(()) => vec![],
            Err(e) => e.diagnostics.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn missing_files_are_named_at_their_line() {
        let text = "admin:\n  token_file: /nonexistent/t\nservices:\n  s:\n    stick:\n      state_file: /nonexistent/dir/s.table\n";
        let m = messages(text);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(
            m[0].starts_with("c.yaml:2:15: admin.token_file: cannot read /nonexistent/t: "),
            "{m:?}"
        );
        assert_eq!(
            m[1],
            "c.yaml:6:19: services.s.stick.state_file: directory /nonexistent/dir does not exist"
        );
    }

    #[test]
    fn a_world_readable_token_and_a_bad_pem_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "secret\n").unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not pem\n").unwrap();
        let text = format!(
            "admin: {{ token_file: {} }}\nhealth:\n  ca_file: {}\n",
            token.display(),
            ca.display()
        );
        let m = messages(&text);
        assert_eq!(
            m[0],
            format!(
                "c.yaml:1:22: admin.token_file: {} is readable by every user (mode 644): chmod o-rwx it",
                token.display()
            )
        );
        assert_eq!(
            m[1],
            format!(
                "c.yaml:3:12: health.ca_file: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                ca.display()
            )
        );
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o640)).unwrap();
        let text = format!(
            "admin: {{ token_file: {} }}\nstick: {{ state_file: {}/t }}\n",
            token.display(),
            dir.path().display()
        );
        assert_eq!(messages(&text), Vec::<String>::new());
    }
}
