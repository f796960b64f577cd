//! Where the admin API is and how to talk to it: `--admin`/`--token-file` (or
//! their environment variables) over the `admin:` section of the config given with
//! `-c`, over the default address; and where the address came from, for the error
//! when nothing answers there.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::args::AdminArgs;
use crate::config::Config;

/// The default admin URL (the admin endpoint's default listen address).
pub const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:9140";
pub use crate::config::admin_url;

/// Where the admin address a command uses came from (said when nothing answers there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminSource {
    /// Nothing given: [`DEFAULT_ADMIN_URL`].
    Default,
    /// `--admin`.
    Flag,
    /// `CROSSBAR_ADMIN` in the environment.
    Env,
    /// `admin.listen` of the config file given with `-c`.
    Config(PathBuf),
}

impl std::fmt::Display for AdminSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminSource::Default => write!(
                f,
                "the default (no -c FILE, --admin or CROSSBAR_ADMIN given)"
            ),
            AdminSource::Flag => write!(f, "the one given with --admin"),
            AdminSource::Env => write!(f, "the one in CROSSBAR_ADMIN (environment)"),
            AdminSource::Config(p) => write!(f, "admin.listen of {}", p.display()),
        }
    }
}

/// Where the admin API is and how to talk to it.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Base URL, `http://host:port`.
    pub admin: String,
    /// Where `admin` came from.
    pub source: AdminSource,
    /// File holding the bearer token for write commands.
    pub token_file: Option<PathBuf>,
    /// Print the server's JSON instead of a table.
    pub json: bool,
}

/// What the command line said about the admin endpoint.
#[derive(Debug, Clone, Default)]
pub struct Given {
    /// `--admin URL` or `CROSSBAR_ADMIN`.
    pub url: Option<String>,
    /// `url` came from the environment, not the flag.
    pub url_from_env: bool,
    /// `--token-file` or `CROSSBAR_TOKEN_FILE`.
    pub token_file: Option<PathBuf>,
    /// `--json`.
    pub json: bool,
}

/// `-c FILE` names a config without an admin endpoint.
#[derive(Debug, thiserror::Error)]
#[error("{} disables the admin endpoint (admin.enabled: false): there is no admin API to talk to (a reload is then SIGHUP: systemctl kill -s HUP crossbar)", .0.display())]
pub struct NoAdminEndpoint(pub PathBuf);

impl ClientOptions {
    /// The options of an admin command: `--admin`/`--token-file` (or their
    /// environment variables) first, then `admin.listen` and `admin.token_file` of
    /// `config` (the file given with `-c`, loaded), then the default address.
    pub fn new(
        given: Given,
        config: Option<(&Path, &Config)>,
    ) -> Result<ClientOptions, NoAdminEndpoint> {
        let from_file = match config {
            Some((path, cfg)) => match &cfg.admin {
                Some(a) => Some((path, a)),
                None => return Err(NoAdminEndpoint(path.to_path_buf())),
            },
            None => None,
        };
        let (admin, source) = match (given.url, from_file) {
            (Some(url), _) if given.url_from_env => (url, AdminSource::Env),
            (Some(url), _) => (url, AdminSource::Flag),
            (None, Some((path, a))) => (admin_url(a.listen), AdminSource::Config(path.into())),
            (None, None) => (DEFAULT_ADMIN_URL.to_string(), AdminSource::Default),
        };
        let token_file = given
            .token_file
            .or_else(|| from_file.and_then(|(_, a)| a.token_file.clone()));
        Ok(ClientOptions {
            admin,
            source,
            token_file,
            json: given.json,
        })
    }

    /// The flags another command needs to reach the same endpoint the same way
    /// (appended to the hints `crossbar status` prints): `-c FILE`, or `--admin URL`
    /// and `--token-file FILE`; nothing for the default or the environment.
    pub fn flags(&self) -> String {
        let token = || {
            self.token_file
                .as_ref()
                .map_or(String::new(), |t| format!(" --token-file {}", t.display()))
        };
        match &self.source {
            AdminSource::Config(p) => format!(" -c {}", p.display()),
            AdminSource::Flag => format!(" --admin {}{}", self.admin, token()),
            AdminSource::Default | AdminSource::Env => String::new(),
        }
    }
}

/// The client options of `args`: --admin/--token-file (or their environment
/// variables) over -c FILE's `admin:` section over the default. With `check`, FILE
/// is checked like `crossbar check` (the files it names included) and its warnings
/// are printed. On error, what to exit with (the reason is printed).
pub fn options(
    args: AdminArgs,
    url_from_env: bool,
    check: bool,
) -> Result<ClientOptions, ExitCode> {
    let given = Given {
        url: args.url,
        url_from_env,
        token_file: args.token_file,
        json: args.json,
    };
    let Some(path) = args.config else {
        return ClientOptions::new(given, None).map_err(|e| super::outcome::fail(&e));
    };
    let loaded = if check {
        Config::load_and_check_files(&path)
    } else {
        Config::load(&path)
    };
    let cfg = match loaded {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{e}");
            if check {
                eprintln!(
                    "reload refused: {} has errors; the running configuration stays",
                    path.display()
                );
            } else {
                eprintln!("error: the admin address comes from {}: fix it, or give --admin (and --token-file)", path.display());
            }
            return Err(ExitCode::FAILURE);
        }
    };
    if check {
        for w in &cfg.warnings {
            eprintln!("{w}");
        }
    }
    ClientOptions::new(given, Some((&path, &cfg))).map_err(|e| super::outcome::fail(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_come_from_flags_then_env_then_the_config_file() {
        let cfg = Config::from_str_at(
            "admin: { listen: \"0.0.0.0:9999\", token_file: /etc/t }\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n",
            Path::new("c.yaml"),
        )
        .unwrap();
        let file = Some((Path::new("c.yaml"), &cfg));
        let o = ClientOptions::new(Given::default(), file).unwrap();
        assert_eq!(o.admin, "http://127.0.0.1:9999");
        assert_eq!(o.source, AdminSource::Config("c.yaml".into()));
        assert_eq!(o.token_file, Some(PathBuf::from("/etc/t")));
        assert_eq!(o.flags(), " -c c.yaml");
        let flag = Given {
            url: Some("http://[::1]:1".into()),
            token_file: Some("/x".into()),
            ..Given::default()
        };
        let o = ClientOptions::new(flag.clone(), file).unwrap();
        assert_eq!(
            (o.admin.as_str(), &o.source, &o.token_file),
            ("http://[::1]:1", &AdminSource::Flag, &Some("/x".into()))
        );
        assert_eq!(o.flags(), " --admin http://[::1]:1 --token-file /x");
        let env = Given {
            url_from_env: true,
            ..flag
        };
        assert_eq!(
            ClientOptions::new(env, None).unwrap().source,
            AdminSource::Env
        );
        let o = ClientOptions::new(Given::default(), None).unwrap();
        assert_eq!(
            (o.admin.as_str(), &o.source, o.flags().as_str()),
            (DEFAULT_ADMIN_URL, &AdminSource::Default, "")
        );
        let off = Config::from_str_at(
            "admin: { enabled: false }\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n",
            Path::new("off.yaml"),
        )
        .unwrap();
        assert!(ClientOptions::new(Given::default(), Some((Path::new("off.yaml"), &off))).is_err());
    }
}
