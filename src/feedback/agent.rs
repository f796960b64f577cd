//! HAProxy's agent-check answer: one line of words separated by spaces, tabs or
//! commas, in any order (HAProxy's configuration manual, `agent-check`):
//! `NN%` (the weight, a percentage of the configured one), `maxconn:N`, `ready`,
//! `drain`, `maint` (the administrative state), `up`, `down`, `fail`, `stopped`
//! (the operational state; the last three may carry `#description`).
//!
//! What a word does in crossbar differs in one way: feedback scales a weight and
//! never changes a backend's state, so `drain`, `maint`, `down`, `fail` and
//! `stopped` hold the backend at the service's floor weight (sticky and resumed
//! clients still land, a trickle of new ones too) until `ready` or `up`; the
//! operator's `crossbar backend drain` and the health check keep their say.
//! Words not advertised keep their last value, as in HAProxy.
//!
//! Pure: [`parse`] takes the bytes read, bounded by the poller.

/// Longest answer read: HAProxy's agents answer one short line (`up 75%\n`).
pub const MAX_ANSWER: usize = 512;
/// Longest `#description` kept for the views.
const MAX_DESCRIPTION: usize = 64;
/// Largest percentage: 16 times the configured weight (the factor's bound, `weight::MAX_FACTOR`).
const MAX_PERCENT: u32 = 1600;

/// The administrative words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentAdmin {
    /// `ready`: back from drain or maint.
    Ready,
    /// `drain`: no new connections but persistent ones (here: the floor).
    Drain,
    /// `maint`: maintenance (here: the floor).
    Maint,
}

/// The operational words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentHealth {
    /// `up`.
    Up,
    /// `down`, `fail` or `stopped` (the word), with its `#description`.
    Down {
        /// The word said.
        word: &'static str,
        /// What followed `#`, if anything.
        description: Option<String>,
    },
}

/// An answer, or what the answers so far add up to (see [`AgentReply::then`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentReply {
    /// `NN%`.
    pub percent: Option<u32>,
    /// `maxconn:N` (0: no limit).
    pub maxconn: Option<u32>,
    /// `ready`, `drain`, `maint`.
    pub admin: Option<AgentAdmin>,
    /// `up`, `down`, `fail`, `stopped`.
    pub health: Option<AgentHealth>,
}

impl AgentReply {
    /// The words of `new` over these: what an answer does not say stays as it was.
    pub fn then(&self, new: &AgentReply) -> AgentReply {
        AgentReply {
            percent: new.percent.or(self.percent),
            maxconn: new.maxconn.or(self.maxconn),
            admin: new.admin.or(self.admin),
            health: new.health.clone().or_else(|| self.health.clone()),
        }
    }

    /// The agent asked for no new connections (drain, maint, down, fail, stopped).
    pub fn stops(&self) -> bool {
        matches!(self.admin, Some(AgentAdmin::Drain | AgentAdmin::Maint))
            || matches!(self.health, Some(AgentHealth::Down { .. }))
    }

    /// The words in effect, as the views show them (`up 75% maxconn:30`).
    pub fn words(&self) -> String {
        let mut w: Vec<String> = Vec::new();
        match &self.health {
            Some(AgentHealth::Up) => w.push("up".into()),
            Some(AgentHealth::Down { word, description }) => match description {
                Some(d) => w.push(format!("{word}#{d}")),
                None => w.push((*word).into()),
            },
            None => {}
        }
        match self.admin {
            Some(AgentAdmin::Ready) => w.push("ready".into()),
            Some(AgentAdmin::Drain) => w.push("drain".into()),
            Some(AgentAdmin::Maint) => w.push("maint".into()),
            None => {}
        }
        w.extend(self.percent.map(|p| format!("{p}%")));
        w.extend(self.maxconn.map(|n| format!("maxconn:{n}")));
        w.join(" ")
    }
}

/// Why an answer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// Nothing but separators.
    #[error("the agent answered nothing")]
    Empty,
    /// More than [`MAX_ANSWER`] bytes before the end of the line.
    #[error("the agent's answer is longer than {MAX_ANSWER} bytes")]
    TooLong,
    /// Bytes that are not printable ASCII.
    #[error("the agent's answer is not text (byte 0x{0:02x})")]
    NotText(u8),
    /// A word HAProxy does not document.
    #[error("the agent answered an unknown word `{0}`")]
    UnknownWord(String),
    /// `NN%` out of range or not a number.
    #[error("`{0}` is not a weight percentage (0% to {MAX_PERCENT}%)")]
    BadPercent(String),
    /// `maxconn:` without a number.
    #[error("`{0}` is not `maxconn:N`")]
    BadMaxconn(String),
}

/// Parse an agent's answer: the bytes up to the first line end (CR or LF), or all
/// of them at the end of the stream (HAProxy ignores such a line; crossbar takes
/// it). A `#` starts the description, to the end of the line.
pub fn parse(answer: &[u8]) -> Result<AgentReply, AgentError> {
    let line = match answer.iter().position(|&b| b == b'\n' || b == b'\r') {
        Some(end) => &answer[..end],
        None => answer,
    };
    if line.len() > MAX_ANSWER {
        return Err(AgentError::TooLong);
    }
    if let Some(&b) = line
        .iter()
        .find(|&&b| b != b'\t' && !(0x20..0x7f).contains(&b))
    {
        return Err(AgentError::NotText(b));
    }
    // Printable ASCII only, so nothing is lost.
    let text = String::from_utf8_lossy(line);
    let (words, description) = match text.split_once('#') {
        Some((w, d)) => (w, Some(d.trim())),
        None => (&*text, None),
    };
    let description = description
        .filter(|d| !d.is_empty())
        .map(|d| d.chars().take(MAX_DESCRIPTION).collect::<String>());
    let mut reply = AgentReply::default();
    let mut any = false;
    for word in words.split([' ', '\t', ',']).filter(|w| !w.is_empty()) {
        any = true;
        word_into(word, &mut reply)?;
    }
    if let Some(AgentHealth::Down { description: d, .. }) = &mut reply.health {
        *d = description;
    }
    if any {
        Ok(reply)
    } else {
        Err(AgentError::Empty)
    }
}

/// One word into `reply`; a later word of the same kind wins (HAProxy's rule).
fn word_into(word: &str, reply: &mut AgentReply) -> Result<(), AgentError> {
    let lower = word.to_ascii_lowercase();
    if let Some(n) = lower.strip_suffix('%') {
        let p = n.parse::<u32>().ok().filter(|&p| p <= MAX_PERCENT);
        reply.percent = Some(p.ok_or_else(|| AgentError::BadPercent(word.into()))?);
        return Ok(());
    }
    if let Some(n) = lower.strip_prefix("maxconn:") {
        let n = n
            .parse::<u32>()
            .map_err(|_| AgentError::BadMaxconn(word.into()))?;
        reply.maxconn = Some(n);
        return Ok(());
    }
    let down = |word| AgentHealth::Down {
        word,
        description: None,
    };
    match lower.as_str() {
        "ready" => reply.admin = Some(AgentAdmin::Ready),
        "drain" => reply.admin = Some(AgentAdmin::Drain),
        "maint" => reply.admin = Some(AgentAdmin::Maint),
        "up" => reply.health = Some(AgentHealth::Up),
        "down" => reply.health = Some(down("down")),
        "fail" => reply.health = Some(down("fail")),
        "stopped" => reply.health = Some(down("stopped")),
        _ => {
            let shown = word.chars().take(MAX_DESCRIPTION).collect();
            return Err(AgentError::UnknownWord(shown));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> AgentReply {
        parse(s.as_bytes()).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn every_documented_word_is_understood() {
        assert_eq!(ok("75%\n").percent, Some(75));
        assert_eq!(ok("0%").percent, Some(0));
        assert_eq!(ok("maxconn:30\n").maxconn, Some(30));
        assert_eq!(ok("ready").admin, Some(AgentAdmin::Ready));
        assert_eq!(ok("drain").admin, Some(AgentAdmin::Drain));
        assert_eq!(ok("maint").admin, Some(AgentAdmin::Maint));
        assert_eq!(ok("up").health, Some(AgentHealth::Up));
        for word in ["down", "fail", "stopped"] {
            let r = ok(word);
            assert_eq!(
                r.health,
                Some(AgentHealth::Down {
                    word,
                    description: None
                })
            );
            assert!(r.stops(), "{word}");
        }
        for answer in [
            "stopped #puppetserver restarting\n",
            "stopped#puppetserver restarting",
        ] {
            let r = ok(answer);
            assert!(r.stops());
            let description = Some("puppetserver restarting".into());
            assert_eq!(
                r.health,
                Some(AgentHealth::Down {
                    word: "stopped",
                    description
                })
            );
        }
        assert_eq!(
            ok("down#").health,
            Some(AgentHealth::Down {
                word: "down",
                description: None
            })
        );
        assert_eq!(
            ok("up #all fine").health,
            Some(AgentHealth::Up),
            "a description needs a down word"
        );
    }

    #[test]
    fn words_combine_in_any_order_with_any_separator() {
        let r = ok("up 75%,maxconn:30\tready\r\n");
        assert_eq!(r.health, Some(AgentHealth::Up));
        assert_eq!(r.percent, Some(75));
        assert_eq!(r.maxconn, Some(30));
        assert_eq!(r.admin, Some(AgentAdmin::Ready));
        assert!(!r.stops());
        assert_eq!(r.words(), "up ready 75% maxconn:30");
        assert_eq!(
            ok("UP 50%").health,
            Some(AgentHealth::Up),
            "case does not matter"
        );
        assert_eq!(ok("drain 10% drain").words(), "drain 10%");
        assert_eq!(ok("up\nextra line ignored").health, Some(AgentHealth::Up));
        assert_eq!(
            ok("up\rdown\n").health,
            Some(AgentHealth::Up),
            "CR ends the line too"
        );
    }

    #[test]
    fn unsaid_words_keep_their_last_value() {
        let first = ok("drain 40%");
        let second = first.then(&ok("maxconn:10"));
        assert_eq!(second.admin, Some(AgentAdmin::Drain));
        assert_eq!(second.percent, Some(40));
        assert_eq!(second.maxconn, Some(10));
        let third = second.then(&ok("ready"));
        assert!(!third.stops());
        assert_eq!(third.percent, Some(40));
    }

    #[test]
    fn garbage_and_oversized_answers_are_refused() {
        assert_eq!(parse(b""), Err(AgentError::Empty));
        assert_eq!(parse(b" , \t\n"), Err(AgentError::Empty));
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\n"),
            Err(AgentError::UnknownWord("HTTP/1.1".into()))
        );
        assert_eq!(
            parse(b"SSH-2.0-OpenSSH_9.2"),
            Err(AgentError::UnknownWord("SSH-2.0-OpenSSH_9.2".into()))
        );
        assert_eq!(parse(b"up\x00"), Err(AgentError::NotText(0)));
        assert_eq!(
            parse(b"\x16\x03\x01\x02\x00"),
            Err(AgentError::NotText(0x16))
        );
        assert_eq!(parse("up é".as_bytes()), Err(AgentError::NotText(0xc3)));
        assert_eq!(parse(b"75"), Err(AgentError::UnknownWord("75".into())));
        assert_eq!(parse(b"-5%"), Err(AgentError::BadPercent("-5%".into())));
        assert_eq!(
            parse(b"99999%"),
            Err(AgentError::BadPercent("99999%".into()))
        );
        assert_eq!(parse(b"x%"), Err(AgentError::BadPercent("x%".into())));
        assert_eq!(
            parse(b"maxconn:"),
            Err(AgentError::BadMaxconn("maxconn:".into()))
        );
        assert_eq!(
            parse(b"maxconn:-1"),
            Err(AgentError::BadMaxconn("maxconn:-1".into()))
        );
        let long = vec![b'u'; MAX_ANSWER + 1];
        assert_eq!(parse(&long), Err(AgentError::TooLong));
        let mut long_line = vec![b' '; MAX_ANSWER + 1];
        long_line.extend_from_slice(b"up\n");
        assert_eq!(parse(&long_line), Err(AgentError::TooLong));
        assert_eq!(parse(b"#only a description"), Err(AgentError::Empty));
        let word = "x".repeat(200);
        match parse(word.as_bytes()) {
            Err(AgentError::UnknownWord(w)) => assert!(w.len() <= MAX_DESCRIPTION),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_prefix_of_an_answer_parses_or_is_refused_without_panic() {
        let answer = b"up 75%,maxconn:30 stopped#bye ready\r\n";
        for n in 0..=answer.len() {
            let _ = parse(&answer[..n]); // ok: only the absence of a panic is tested
        }
    }
}
