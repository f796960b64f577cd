//! Where the admin API is and how to talk to it: `--admin`/`--token-file` (or
//! their environment variables) over the `admin:` section of the config given with
//! `-c` (else of the default config `check` and `run` read, when it is there), over
//! the default address; and where the address and the token came from, for the
//! error when nothing answers there or the token is refused.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::config::{Config, DEFAULT_CONFIG_PATH};

/// The default admin URL (the admin endpoint's default listen address).
pub const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:9140";
pub use crate::config::admin_url;

/// Where the admin address a command uses came from (said when nothing answers there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminSource {
    /// Nothing given and no default config to read (why not: `/etc/crossbar/crossbar.yaml
    /// does not exist`): [`DEFAULT_ADMIN_URL`].
    Default(String),
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
            AdminSource::Default(why) => write!(
                f,
                "the default (no -c FILE, --admin or CROSSBAR_ADMIN given, and {why})"
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
    /// Where `token_file` came from (said when the server refuses the token).
    pub token_source: TokenSource,
    /// Print the server's JSON instead of a table.
    pub json: bool,
}

/// Where the token a command sends came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// No token file: writes go without a token.
    None,
    /// `--token-file` or `CROSSBAR_TOKEN_FILE`.
    Flag,
    /// `admin.token_file` of this config file.
    Config(PathBuf),
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::None => write!(
                f,
                "none was sent (no --token-file or CROSSBAR_TOKEN_FILE given, and no \
                 admin.token_file in the config used)"
            ),
            TokenSource::Flag => write!(
                f,
                "the file given with --token-file (or CROSSBAR_TOKEN_FILE)"
            ),
            TokenSource::Config(p) => write!(f, "admin.token_file of {}", p.display()),
        }
    }
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
        Ok(ClientOptions::from_parts(
            given,
            from_file,
            format!("{DEFAULT_CONFIG_PATH} was not read"),
        ))
    }

    /// The options from what was given and the `admin:` section of the config read,
    /// if any; `no_file` says why none was read, for the default address's source.
    fn from_parts(
        given: Given,
        from_file: Option<(&Path, &crate::config::AdminConfig)>,
        no_file: String,
    ) -> ClientOptions {
        let (admin, source) = match (given.url, from_file) {
            (Some(url), _) if given.url_from_env => (url, AdminSource::Env),
            (Some(url), _) => (url, AdminSource::Flag),
            (None, Some((path, a))) => (admin_url(a.listen), AdminSource::Config(path.into())),
            (None, None) => (DEFAULT_ADMIN_URL.to_string(), AdminSource::Default(no_file)),
        };
        let (token_file, token_source) = match (given.token_file, from_file) {
            (Some(t), _) => (Some(t), TokenSource::Flag),
            (None, Some((path, a))) if a.token_file.is_some() => {
                (a.token_file.clone(), TokenSource::Config(path.into()))
            }
            (None, _) => (None, TokenSource::None),
        };
        ClientOptions {
            admin,
            source,
            token_file,
            token_source,
            json: given.json,
        }
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
            // The default config is found without -c.
            AdminSource::Config(p) if p == Path::new(DEFAULT_CONFIG_PATH) => String::new(),
            AdminSource::Config(p) => format!(" -c {}", p.display()),
            AdminSource::Flag => format!(" --admin {}{}", self.admin, token()),
            AdminSource::Default(_) | AdminSource::Env => String::new(),
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
    let path = match (args.config, given.url.is_some()) {
        (Some(path), _) => path,
        // --admin names the endpoint: no config is read for it.
        (None, true) => {
            return Ok(ClientOptions::from_parts(
                given,
                None,
                "--admin given".into(),
            ))
        }
        (None, false) => match default_config() {
            Ok(path) => path,
            Err(why) => return Ok(ClientOptions::from_parts(given, None, why)),
        },
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

/// The config `check` and `run` read without `-c`, when there is one to read;
/// else why not (`/etc/crossbar/crossbar.yaml does not exist`), said with the
/// default address when nothing answers there.
fn default_config() -> Result<PathBuf, String> {
    let path = PathBuf::from(DEFAULT_CONFIG_PATH);
    match std::fs::File::open(&path) {
        Ok(_) => Ok(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{DEFAULT_CONFIG_PATH} does not exist"))
        }
        Err(e) => Err(format!("{DEFAULT_CONFIG_PATH} cannot be read: {e}")),
    }
}

/// How to reach the admin API.
#[derive(clap::Args)]
pub struct AdminArgs {
    /// crossbar's configuration file: the admin address and token file come from
    /// its `admin:` section (--admin and --token-file override it) [default:
    /// /etc/crossbar/crossbar.yaml, when it exists and --admin is not given].
    #[arg(short, long)]
    pub config: Option<PathBuf>,
    /// Admin endpoint URL [default: admin.listen of the config, else http://127.0.0.1:9140].
    #[arg(long = "admin", env = "CROSSBAR_ADMIN", value_name = "URL")]
    pub url: Option<String>,
    /// File holding the bearer token (needed for writes when the server has admin.token_file).
    #[arg(long, env = "CROSSBAR_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
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
            (
                DEFAULT_ADMIN_URL,
                &AdminSource::Default(format!("{DEFAULT_CONFIG_PATH} was not read")),
                ""
            )
        );
        let off = Config::from_str_at(
            "admin: { enabled: false }\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n",
            Path::new("off.yaml"),
        )
        .unwrap();
        assert!(ClientOptions::new(Given::default(), Some((Path::new("off.yaml"), &off))).is_err());
    }
}
