//! The access log: one line per connection on target `crossbar::access`, written
//! once at its end (error lines are bounded by `log_writer::LogLimiter`).
use std::fmt;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::service::Service;

/// The fields of one access-log line, filled in as the connection progresses.
#[derive(Default)]
pub struct AccessLog {
    /// The client a trusted tier's PROXY header named (the TCP peer, logged as
    /// `via`, is then the tier); `None`: the peer is the client.
    pub proxied: Option<SocketAddr>,
    /// The service it was routed to (its `Arc`: naming it costs no allocation).
    pub service: Option<Arc<Service>>,
    /// The stick key kind that decided (or was last looked up).
    pub stick: Option<&'static str>,
    /// Whether that lookup hit.
    pub stick_hit: bool,
    /// It hit a backend that load feedback showed saturated, and was placed like a
    /// new session instead (`feedback.saturated_sticky`).
    pub stick_saturated: bool,
    /// The backend connected to (or last tried).
    pub backend: Option<Arc<str>>,
    /// Backends the ClientHello was offered to (more than one while confirming);
    /// a `u32` beside the two timers, so the three fit where a `usize` was (the
    /// line lives in every connection's future: `conn::size_probe`).
    pub tried: u32,
    /// Milliseconds it waited in the service's queue for a backend slot, summed
    /// over its picks and rounded up (0: it never queued); `None`: it never
    /// reached a pick (refused or gone before one). HAProxy's `Tw`.
    pub queue_ms: Option<u32>,
    /// Milliseconds of its TCP dials to backends, every try counted (the failed
    /// ones too, each cut down to whole milliseconds); `None`: none was tried.
    /// HAProxy's `Tc`, which counts retries too.
    pub connect_ms: Option<u32>,
    /// How placement confirmation ended, if it ran.
    pub confirm: Option<&'static str>,
    /// `full` or `resumed`, once the server's handshake showed it.
    pub handshake: Option<&'static str>,
    /// Bytes client -> server, the replayed hello included.
    pub c2s: u64,
    /// Bytes server -> client.
    pub s2c: u64,
    /// How the connection ended (the termination reason), in two static words.
    pub end: End,
    /// The error, if it ended in one.
    pub error: Option<String>,
}

impl AccessLog {
    /// Write the line for the connection from `peer` on `listener`, begun at `started`:
    /// `client=` the client (named by a PROXY header, or the peer), `via=` the tier
    /// it came through (`-`: none); `sni` the name the client sent, kept by the
    /// connection (not copied here).
    ///
    /// When the log is plain text on the log queue ([`crate::log_writer::direct`])
    /// the line is formatted here, byte for byte as tracing-subscriber prints the
    /// event with these fields (timestamp, level, target, `name=value` with strings
    /// quoted and escaped as `Debug` does), and queued: its field visitor, style
    /// wrappers and escaping writer took a third of a connection's user-space
    /// instructions (docs/performance.md, "Access log"). `RUST_LOG` still decides
    /// whether it is written. JSON and colour go through tracing as fields.
    pub fn write(&self, peer: SocketAddr, listener: &str, started: Instant, sni: Option<&str>) {
        // Nothing is read (not even the clock) for a line `RUST_LOG` turns off.
        if !tracing::enabled!(target: "crossbar::access", tracing::Level::INFO) {
            return;
        }
        let line = Line {
            log: self,
            peer,
            listener,
            sni: sni.unwrap_or("-"),
            duration_ms: started.elapsed().as_millis() as u64,
        };
        if let Some(queue) = crate::log_writer::direct() {
            queue.queue(line.text(SystemTime::now()));
            return;
        }
        tracing::info!(
            target: "crossbar::access",
            client = %line.client(),
            via = %line.via(),
            listener = %listener,
            sni = line.sni,
            service = line.service(),
            stick = self.stick.unwrap_or("-"),
            stick_result = line.stick_result(),
            backend = self.backend.as_deref().unwrap_or("-"),
            tried = self.tried,
            queue_ms = self.queue_ms,
            connect_ms = self.connect_ms,
            confirm = self.confirm.unwrap_or("-"),
            handshake = self.handshake.unwrap_or("-"),
            bytes_in = self.c2s,
            bytes_out = self.s2c,
            duration_ms = line.duration_ms,
            end = %self.end,
            error = self.error.as_deref().unwrap_or(""),
        );
    }
}

/// One access-log line's values.
struct Line<'a> {
    log: &'a AccessLog,
    peer: SocketAddr,
    listener: &'a str,
    sni: &'a str,
    duration_ms: u64,
}

impl Line<'_> {
    fn client(&self) -> SocketAddr {
        self.log.proxied.unwrap_or(self.peer)
    }

    fn via(&self) -> Via {
        Via(self.log.proxied.map(|_| self.peer))
    }

    fn service(&self) -> &str {
        self.log.service.as_deref().map_or("-", Service::name)
    }

    fn stick_result(&self) -> &'static str {
        match (self.log.stick, self.log.stick_hit) {
            (None, _) => "-",
            (Some(_), true) if self.log.stick_saturated => "saturated",
            (Some(_), true) => "hit",
            (Some(_), false) => "miss",
        }
    }

    /// The whole text line, as tracing-subscriber's default format prints the event
    /// at `now` with colour off: RFC 3339 time in microseconds, the level padded to
    /// five, the target, the fields, a newline.
    fn text(&self, now: SystemTime) -> Vec<u8> {
        let mut out = Vec::with_capacity(crate::log_writer::LINE_CAPACITY);
        let time = humantime::format_rfc3339_micros(now);
        // Writing into a Vec cannot fail.
        let _ = writeln!(out, "{time}  INFO crossbar::access: {self}");
        out
    }
}

impl fmt::Display for Line<'_> {
    /// The fields in the order the event names them: `%` fields (addresses, `end`)
    /// plain, strings as `Debug` (quoted, escaped), numbers plain, a number that
    /// is `None` left out (as tracing leaves out an `Option` field that is `None`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = self.log;
        write!(
            f,
            "client={} via={} listener={} sni={:?} service={:?} stick={:?} stick_result={:?} \
             backend={:?} tried={}{}{} confirm={:?} handshake={:?} bytes_in={} bytes_out={} \
             duration_ms={} end={} error={:?}",
            self.client(),
            self.via(),
            self.listener,
            self.sni,
            self.service(),
            l.stick.unwrap_or("-"),
            self.stick_result(),
            l.backend.as_deref().unwrap_or("-"),
            l.tried,
            Opt(" queue_ms=", l.queue_ms),
            Opt(" connect_ms=", l.connect_ms),
            l.confirm.unwrap_or("-"),
            l.handshake.unwrap_or("-"),
            l.c2s,
            l.s2c,
            self.duration_ms,
            l.end,
            l.error.as_deref().unwrap_or(""),
        )
    }
}

/// A termination reason: a side's prefix (`hello_error:`, `refused:`, ...; may be
/// empty) and the word, both static so that ending a connection allocates nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct End {
    /// The prefix naming the side or step (`""` for none).
    pub prefix: &'static str,
    /// The reason itself.
    pub word: &'static str,
}

impl End {
    /// A reason without a prefix.
    pub fn word(word: &'static str) -> End {
        End { prefix: "", word }
    }
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.prefix)?;
        f.write_str(self.word)
    }
}

/// ` name=value` for a number that is there, nothing for one that is not.
struct Opt(&'static str, Option<u32>);

impl fmt::Display for Opt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(v) => write!(f, "{}{v}", self.0),
            None => Ok(()),
        }
    }
}

/// A `via` value: the address, or `-`.
struct Via(Option<SocketAddr>);

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(a) => a.fmt(f),
            None => f.write_str("-"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A writer the subscriber prints into; the test reads it back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    const PEER: &str = "10.1.2.3:40000";
    const LISTENER: &str = "0.0.0.0:8140";

    /// What tracing-subscriber's default text format (colour off) prints for the
    /// event with its fields, and the timestamp format it uses.
    fn printed(log: &AccessLog, sni: Option<&str>, with_time: bool) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let builder = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false);
        let peer: SocketAddr = PEER.parse().unwrap();
        let emit = || log.write(peer, LISTENER, Instant::now(), sni);
        match with_time {
            true => tracing::subscriber::with_default(builder.finish(), emit),
            false => tracing::subscriber::with_default(builder.without_time().finish(), emit),
        }
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
    }

    /// The line formatted here, as the direct path queues it.
    fn direct(log: &AccessLog, sni: Option<&str>, now: SystemTime) -> String {
        let line = Line {
            log,
            peer: PEER.parse().unwrap(),
            listener: LISTENER,
            sni: sni.unwrap_or("-"),
            duration_ms: 0,
        };
        String::from_utf8(line.text(now)).unwrap()
    }

    /// Lines with `duration_ms=N` set to 0 (the two writes may be a millisecond apart).
    fn no_duration(s: &str) -> String {
        let i = s.find("duration_ms=").unwrap() + "duration_ms=".len();
        let j = i + s[i..].find(' ').unwrap();
        format!("{}0{}", &s[..i], &s[j..])
    }

    #[test]
    fn the_direct_line_is_what_the_formatter_prints() {
        let full = AccessLog {
            proxied: Some("192.0.2.7:51000".parse().unwrap()),
            stick: Some("session_id"),
            stick_hit: true,
            backend: Some(Arc::from("master-1")),
            tried: 2,
            queue_ms: Some(0),
            connect_ms: Some(17),
            confirm: Some("confirmed"),
            handshake: Some("resumed"),
            c2s: 517,
            s2c: 12_345,
            end: End {
                prefix: "refused:",
                word: "no_backend",
            },
            error: Some("connect failed: \"refused\"\tnow\u{1b}[31m".into()),
            ..AccessLog::default()
        };
        let hostile_sni = "pup pet\"=x\\y\u{7f}\u{1b}[0mé";
        let now = SystemTime::now();
        for (log, sni) in [(&full, Some(hostile_sni)), (&AccessLog::default(), None)] {
            let ours = direct(log, sni, now);
            // " INFO crossbar::access: ..." after the timestamp and one space.
            let (time, rest) = ours.split_once(' ').unwrap();
            let theirs = printed(log, sni, false);
            assert_eq!(no_duration(rest), no_duration(&theirs));
            // The same timestamp format: what the formatter printed has one as long,
            // with the same separators, ending in 'Z' after six fraction digits.
            let with_time = printed(log, sni, true);
            let their_time = with_time.split(' ').next().unwrap();
            assert_eq!(time.len(), their_time.len(), "{time} / {their_time}");
            let shape = |t: &str| {
                t.chars()
                    .map(|c| if c.is_ascii_digit() { '9' } else { c })
                    .collect::<String>()
            };
            assert_eq!(shape(time), shape(their_time));
        }
        let line = direct(&full, Some(hostile_sni), now);
        assert!(
            line.contains(r#"sni="pup pet\"=x\\y\u{7f}\u{1b}[0mé" service="-""#),
            "{line}"
        );
        assert!(
            line.contains("client=192.0.2.7:51000 via=10.1.2.3:40000 listener=0.0.0.0:8140"),
            "{line}"
        );
        assert!(line.contains("end=refused:no_backend error="), "{line}");
        assert!(
            line.contains(" tried=2 queue_ms=0 connect_ms=17 confirm="),
            "{line}"
        );
        let bare = direct(&AccessLog::default(), None, now);
        assert!(bare.contains(" tried=0 confirm=\"-\""), "{bare}");
        assert!(line.ends_with("\"\n"), "{line}");
    }
}
