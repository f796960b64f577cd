//! Why an admin API call is not answered with 200, and the HTTP status each cause
//! gets; the message is the `error` of the JSON answer ([`super::view::ErrorView`]).

/// An API call that cannot be answered with 200.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No such service.
    #[error("unknown service {name:?}{}", did_you_mean(nearest.as_deref()))]
    UnknownService {
        /// The name asked.
        name: String,
        /// The service's name nearest to it ([`crate::config::nearest`]).
        nearest: Option<String>,
    },
    /// No such backend in the service.
    #[error("unknown backend {backend:?} in service {service:?}{}", did_you_mean(nearest.as_deref()))]
    UnknownBackend {
        /// Service.
        service: String,
        /// Backend.
        backend: String,
        /// The service's backend name nearest to it.
        nearest: Option<String>,
    },
    /// No open connection matched the id or client to close.
    #[error("no open connection with {0} (crossbar connections lists them, with their ids)")]
    NoConnection(String),
    /// The service has no stick table.
    #[error("service {0:?} has no stick table (no `stick:` in its config)")]
    NoTable(String),
    /// A query parameter is malformed or out of range.
    #[error("bad query: {0}")]
    BadQuery(String),
    /// No stick entry matched the key or client to delete.
    #[error("no stick entry of service {service:?} for {what}")]
    NoEntry {
        /// Service.
        service: String,
        /// `key K` or `client A (prefix P)`.
        what: String,
    },
    /// Draining or disabling this backend would leave its service with no backend
    /// available, and `force` was not given.
    #[error("{backend} is the last available backend of service {service:?}{others}: to {action} it leaves no backend for new connections (every new client is refused: no_backend); add force=true to do it anyway (crossbar backend {action} --force)")]
    LastBackend {
        /// Service.
        service: String,
        /// Backend.
        backend: String,
        /// `drain` or `disable`.
        action: &'static str,
        /// The other backends and their states, `" (others: b2 down)"`, or `""`.
        others: String,
    },
    /// `enable` on a backend that left DNS: nothing the operator sets puts it
    /// back in rotation (it drains, and leaves the pool once its last connection
    /// ends); listing it in DNS again does.
    #[error("{backend} left DNS (the {name} record of service {service:?} no longer lists it): it drains and leaves the pool once its last connection ends, and enable can't put it back in rotation; list it in DNS again to keep it (it rejoins on the next lookup)")]
    LeftDns {
        /// Service.
        service: String,
        /// Backend.
        backend: String,
        /// The DNS name the service discovers from.
        name: String,
    },
    /// Setting this backend's weight to 0 would leave its service with no backend
    /// for new connections, and `force` was not given.
    #[error("{backend} is the last backend of service {service:?} taking new connections{others}: weight 0 leaves none for new connections (every new client is refused: no_backend; sticky hits still reach it); add force=true to do it anyway (crossbar backend weight {service}/{backend} 0 --force)")]
    LastWeighted {
        /// Service.
        service: String,
        /// Backend.
        backend: String,
        /// The other backends and their states, `" (others: b2 drain)"`, or `""`.
        others: String,
    },
    /// The configuration file could not be reloaded; the old one keeps running.
    #[error("reload failed, keeping the running configuration: {0}")]
    ReloadFailed(crate::server::ApplyError),
    /// An operator write (`drain`, `enable`, `disable`, `weight`, `reset`) was not
    /// applied: crossbar is shutting down, or its reload task ended.
    #[error("{action} not applied: {why}")]
    NotApplied {
        /// The write: `drain`, `enable`, `disable`, `weight`, `reset`.
        action: &'static str,
        /// Why the reload task could not take it.
        why: crate::server::ApplyError,
    },
    /// The answer could not be built (a worker thread failed).
    #[error("internal error: {0}")]
    Internal(String),
}

/// `: did you mean "x"?`, or nothing.
fn did_you_mean(nearest: Option<&str>) -> String {
    nearest.map_or(String::new(), |n| format!(": did you mean {n:?}?"))
}

impl ApiError {
    /// The HTTP status for this error.
    pub fn status(&self) -> hyper::StatusCode {
        use hyper::StatusCode as S;
        match self {
            ApiError::UnknownService { .. }
            | ApiError::UnknownBackend { .. }
            | ApiError::NoTable(_)
            | ApiError::NoConnection(_)
            | ApiError::NoEntry { .. } => S::NOT_FOUND,
            ApiError::BadQuery(_) => S::BAD_REQUEST,
            ApiError::LastBackend { .. }
            | ApiError::LastWeighted { .. }
            | ApiError::LeftDns { .. }
            | ApiError::ReloadFailed(crate::server::ApplyError::NoBackendLeft(_)) => S::CONFLICT,
            ApiError::ReloadFailed(_) => S::UNPROCESSABLE_ENTITY,
            ApiError::NotApplied {
                why: crate::server::ApplyError::ShuttingDown,
                ..
            } => S::SERVICE_UNAVAILABLE,
            ApiError::NotApplied { .. } => S::INTERNAL_SERVER_ERROR,
            ApiError::Internal(_) => S::INTERNAL_SERVER_ERROR,
        }
    }
}
