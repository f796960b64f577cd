//! Capture real ClientHellos from locally installed TLS clients as test fixtures.
//!
//! Usage: `cargo run --example capture_hellos -- tests/fixtures/hellos`
//!
//! Each client is pointed at a throwaway listener on 127.0.0.1 (a free port picked by
//! the OS) that only reads until `crossbar::hello::parse_client_hello` finds a complete
//! hello, saves exactly those bytes as `<name>.bin`, and drops the connection. Clients
//! that are not installed are skipped. For the resumption captures (ticket / PSK
//! offers) a session is first obtained from a real `openssl s_server` on loopback.
//! Nothing leaves the machine: no DNS, no internet.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crossbar::hello::{parse_client_hello, HelloParse};

/// How long a client gets to send its hello.
const HELLO_WAIT: Duration = Duration::from_secs(10);
/// Largest hello we keep (a PQ hello is ~2 KiB).
const MAX_HELLO: usize = 64 * 1024;
const HOST: &str = "puppet.example.com";

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or("tests/fixtures/hellos".into()),
    );
    std::fs::create_dir_all(&out)?;
    let work = tempfile::tempdir()?;
    let (cert, key) = write_cert(work.path())?;

    let sess13 = work.path().join("sess13.pem");
    let sess12 = work.path().join("sess12.pem");
    get_openssl_session(&cert, &key, &sess13, &[])?;
    get_openssl_session(&cert, &key, &sess12, &["-tls1_2"])?;
    let sess13 = sess13.to_string_lossy().into_owned();
    let sess12 = sess12.to_string_lossy().into_owned();

    let java_src = work.path().join("Hello.java");
    std::fs::write(&java_src, JAVA_CLIENT)?;
    let java_src = java_src.to_string_lossy().into_owned();

    // Arguments with the listener's port as `PORT`.
    let s_client = |extra: &[&str]| -> (&str, Vec<String>) {
        let mut args = vec![
            "s_client",
            "-connect",
            "127.0.0.1:PORT",
            "-servername",
            HOST,
        ];
        args.extend_from_slice(extra);
        ("openssl", args.into_iter().map(String::from).collect())
    };
    let resolve = format!("{HOST}:PORT:127.0.0.1");
    let url = format!("https://{HOST}:PORT/");
    let curl = |extra: &[&str]| -> (&str, Vec<String>) {
        let mut args = vec!["-sk", "--max-time", "5", "--resolve", &resolve];
        args.extend_from_slice(extra);
        args.push(&url);
        ("curl", args.into_iter().map(String::from).collect())
    };
    let java = |props: &[&str]| -> (&str, Vec<String>) {
        let mut args = props.to_vec();
        args.extend([java_src.as_str(), HOST, "PORT"]);
        ("java", args.into_iter().map(String::from).collect())
    };
    let wget = || -> (&str, Vec<String>) {
        let args = [
            "--no-check-certificate",
            "-t",
            "1",
            "-T",
            "5",
            "-O",
            "/dev/null",
        ];
        let mut args: Vec<String> = args.into_iter().map(String::from).collect();
        args.push("https://localhost:PORT/".into());
        ("wget", args)
    };

    let cases = vec![
        ("openssl3_tls13", s_client(&[])),
        ("openssl3_tls12", s_client(&["-tls1_2"])),
        ("openssl3_tls13_psk", s_client(&["-sess_in", &sess13])),
        (
            "openssl3_tls12_ticket",
            s_client(&["-tls1_2", "-sess_in", &sess12]),
        ),
        ("curl7_openssl3", curl(&[])),
        ("curl7_openssl3_tls12", curl(&["--tls-max", "1.2"])),
        ("java17", java(&[])),
        (
            "java17_tls12",
            java(&["-Djdk.tls.client.protocols=TLSv1.2"]),
        ),
        ("wget_gnutls_localhost", wget()),
    ];
    capture_server_flights(&cert, &key, work.path(), &out.join("../server_flights"))?;

    for (name, (program, args)) in cases {
        match capture(program, &args) {
            Ok(hello) => {
                std::fs::write(out.join(format!("{name}.bin")), &hello)?;
                println!("{name}: {} bytes", hello.len());
            }
            Err(e) => println!("{name}: skipped ({e})"),
        }
    }
    Ok(())
}

/// Run one client against a throwaway listener and return its ClientHello bytes.
fn capture(program: &str, args: &[String]) -> anyhow::Result<Vec<u8>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port().to_string();
    let mut child = Command::new(program)
        .args(args.iter().map(|a| a.replace("PORT", &port)))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let result = read_hello(&listener);
    stop(&mut child);
    result
}

fn read_hello(listener: &TcpListener) -> anyhow::Result<Vec<u8>> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + HELLO_WAIT;
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => anyhow::bail!("no connection: {e}"),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(HELLO_WAIT))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk)?;
        anyhow::ensure!(n > 0, "closed after {} bytes", buf.len());
        buf.extend_from_slice(&chunk[..n]);
        match parse_client_hello(&buf, MAX_HELLO) {
            HelloParse::NeedMore => continue,
            HelloParse::Found(info) => return Ok(buf[..info.consumed].to_vec()),
            HelloParse::Invalid(e) => anyhow::bail!("not a hello: {e}"),
        }
    }
}

/// Record `openssl s_server` flights (full, then resumed, TLS 1.2 and 1.3) through a
/// loopback relay: `<name>.hello.bin` is the client's first flight, `<name>.server.bin`
/// everything the server sent while the client ran.
fn capture_server_flights(cert: &str, key: &str, work: &Path, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let (server_port, mut server) = start_s_server(cert, key)?;
    for (tag, version) in [("tls12", "-tls1_2"), ("tls13", "-tls1_3")] {
        let sess = work.join(format!("relay_{tag}.pem"));
        let sess = sess.to_string_lossy().into_owned();
        for (kind, sess_opt) in [("full", "-sess_out"), ("resumed", "-sess_in")] {
            let args = [version, sess_opt, &sess];
            let (hello, flight) = relay_capture(server_port, &args)?;
            let name = format!("openssl3_{tag}_{kind}");
            std::fs::write(out.join(format!("{name}.hello.bin")), &hello)?;
            std::fs::write(out.join(format!("{name}.server.bin")), &flight)?;
            println!(
                "{name}: hello {} bytes, server {} bytes",
                hello.len(),
                flight.len()
            );
        }
    }
    stop(&mut server);
    Ok(())
}

/// Run `openssl s_client ARGS` through a recording relay to the s_server at `server_port`.
fn relay_capture(server_port: u16, args: &[&str]) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let mut client = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            HOST,
        ])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let (down, _) = listener.accept()?;
    let up = TcpStream::connect(("127.0.0.1", server_port))?;
    let copy = |mut from: TcpStream, mut to: TcpStream| -> Vec<u8> {
        let mut seen = Vec::new();
        let mut chunk = [0u8; 4096];
        if from.set_read_timeout(Some(Duration::from_secs(3))).is_err() {
            return seen;
        }
        while let Ok(n) = from.read(&mut chunk) {
            if n == 0 || to.write_all(&chunk[..n]).is_err() {
                break;
            }
            seen.extend_from_slice(&chunk[..n]);
        }
        seen
    };
    let (c2s, s2c) = std::thread::scope(|scope| -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
        let a = scope.spawn({
            let (from, to) = (down.try_clone()?, up.try_clone()?);
            move || copy(from, to)
        });
        let b = scope.spawn({
            let (from, to) = (up.try_clone()?, down.try_clone()?);
            move || copy(from, to)
        });
        // Let the handshake and the TLS 1.3 tickets through, then end the client.
        std::thread::sleep(Duration::from_millis(1500));
        stop(&mut client);
        let c2s = a.join().map_err(|_| anyhow::anyhow!("relay thread"))?;
        let s2c = b.join().map_err(|_| anyhow::anyhow!("relay thread"))?;
        Ok((c2s, s2c))
    })?;
    let hello = match parse_client_hello(&c2s, MAX_HELLO) {
        HelloParse::Found(info) => c2s[..info.consumed].to_vec(),
        other => anyhow::bail!("no hello through the relay: {other:?}"),
    };
    Ok((hello, s2c))
}

/// Start `openssl s_server` on a free loopback port and wait until it accepts.
fn start_s_server(cert: &str, key: &str) -> anyhow::Result<(u16, Child)> {
    // Pick a free port, then let s_server take it (a tiny race, fine for a capture tool).
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let server = Command::new("openssl")
        .args([
            "s_server",
            "-accept",
            &format!("127.0.0.1:{port}"),
            "-cert",
            cert,
            "-key",
            key,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + HELLO_WAIT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((port, server))
}

/// End a client we started (by its own handle).
fn stop(child: &mut Child) {
    if let Err(e) = child.kill() {
        eprintln!("kill: {e}");
    }
    if let Err(e) = child.wait() {
        eprintln!("wait: {e}");
    }
}

/// A self-signed certificate for `openssl s_server`, as PEM files.
fn write_cert(dir: &Path) -> anyhow::Result<(String, String)> {
    let ck = rcgen::generate_simple_self_signed(vec![HOST.to_string()])?;
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem())?;
    std::fs::write(&key, ck.key_pair.serialize_pem())?;
    Ok((
        cert.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
    ))
}

/// Handshake `openssl s_client` with a loopback `openssl s_server` and save the session.
fn get_openssl_session(cert: &str, key: &str, out: &Path, extra: &[&str]) -> anyhow::Result<()> {
    let (port, mut server) = start_s_server(cert, key)?;
    let mut client = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            HOST,
        ])
        .args(extra)
        .arg("-sess_out")
        .arg(out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    // Give the client time to receive the server's tickets, then close its stdin.
    std::thread::sleep(Duration::from_secs(1));
    if let Some(mut stdin) = client.stdin.take() {
        stdin.write_all(b"Q\n")?;
    }
    std::thread::sleep(Duration::from_millis(300));
    stop(&mut client);
    stop(&mut server);
    anyhow::ensure!(out.exists(), "no session saved");
    Ok(())
}

/// A Java client that starts a handshake with SNI to 127.0.0.1 (run as a source file).
const JAVA_CLIENT: &str = r#"
import javax.net.ssl.*;
import java.net.Socket;
public class Hello {
    public static void main(String[] a) throws Exception {
        Socket plain = new Socket("127.0.0.1", Integer.parseInt(a[1]));
        SSLSocketFactory f = (SSLSocketFactory) SSLSocketFactory.getDefault();
        SSLSocket s = (SSLSocket) f.createSocket(plain, a[0], Integer.parseInt(a[1]), true);
        s.setSoTimeout(8000);
        s.startHandshake();
    }
}
"#;
