//! How the views write times: RFC 3339 strings (`"2026-11-23T09:12:40Z"`) and Unix
//! seconds (discovery's). A view's field holds a [`SystemTime`] and names its format
//! in one `#[serde(with = ...)]` attribute, so moving a field from one format to the
//! other (discovery's Unix integers to RFC 3339, say) changes that attribute and no
//! reader: the page and the CLI work on `SystemTime` either way.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serializer};

/// `SystemTime` as an RFC 3339 string in whole seconds, UTC (`...Z`).
pub mod rfc3339 {
    use super::*;

    /// Write `t` (its fraction of a second dropped).
    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_seconds(*t))
    }

    /// Read an RFC 3339 string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

/// `Option<SystemTime>` as an RFC 3339 string or `null`.
pub mod rfc3339_opt {
    use super::*;

    /// Write `t` (its fraction of a second dropped), or `null`.
    pub fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(&humantime::format_rfc3339_seconds(*t)),
            None => s.serialize_none(),
        }
    }

    /// Read an RFC 3339 string, or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| humantime::parse_rfc3339(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// `Option<SystemTime>` as Unix seconds or `null`.
pub mod unix_seconds_opt {
    use super::*;

    /// Write `t` as whole seconds since 1970 (a time before 1970 as 0).
    pub fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_some(&unix_seconds(*t)),
            None => s.serialize_none(),
        }
    }

    /// Read whole seconds since 1970, or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(from_unix_seconds))
    }
}

/// Whole seconds since 1970 (0 for a time before).
pub fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The time `secs` seconds after 1970.
pub fn from_unix_seconds(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// Whole seconds from `t` to `now` (0 when `t` is later: clocks of two hosts, or a
/// clock stepped back).
pub fn seconds_between(t: SystemTime, now: SystemTime) -> u64 {
    now.duration_since(t).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Times {
        #[serde(with = "rfc3339")]
        at: SystemTime,
        #[serde(with = "unix_seconds_opt")]
        last: Option<SystemTime>,
    }

    #[test]
    fn both_formats_round_trip() {
        let t = Times {
            at: from_unix_seconds(1_795_425_160),
            last: Some(from_unix_seconds(990)),
        };
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(text, r#"{"at":"2026-11-23T09:12:40Z","last":990}"#);
        assert_eq!(serde_json::from_str::<Times>(&text).unwrap(), t);
        let none = r#"{"at":"1970-01-01T00:00:00Z","last":null}"#;
        let back: Times = serde_json::from_str(none).unwrap();
        assert_eq!((back.at, back.last), (UNIX_EPOCH, None));
        assert!(serde_json::from_str::<Times>(r#"{"at":"yesterday","last":null}"#).is_err());
        assert_eq!(
            seconds_between(from_unix_seconds(5), from_unix_seconds(3)),
            0
        );
    }
}
