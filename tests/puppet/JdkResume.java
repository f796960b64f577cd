// The Puppet Server -> PuppetDB pattern for tests/puppet/run.sh: N JDK clients in
// parallel, each with its own SSLContext (so its own default client session cache, as
// Puppet Server's HTTP client has), all bound to one source address, each doing one
// full handshake and then R resumption attempts in sequence to one VIP, with
// `GET /status/v1/simple` (no client certificate needed) over each connection.
// Prints one line per attempt:
//   RESULT client attempt resumed server protocol     or     ERROR client attempt message
// then DONE. "resumed" is the JDK's own view: the handshake's session carries the
// creation time and the very certificate object of the session the client had before
// (a full handshake parses a new certificate; the JDK gives a TLS 1.3 resumption a new
// session ID). "server" is the CN of the certificate that answered: the two
// puppetservers have their own (ca1.xb.test, ca2.xb.test).
//
// Usage: java -cp DIR JdkResume ca.pem sni protocol clients resumptions source-ip vip:port
//   ca.pem    the Puppet CA bundle (every certificate in it is trusted)
//   protocol  TLSv1.3 or TLSv1.2 (the only version the client offers)
import java.io.FileInputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.util.List;
import javax.net.ssl.SNIHostName;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSession;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManagerFactory;

public class JdkResume {
    // Connect and read timeout per connection: far above a loaded 2-core machine's
    // handshake time, and it bounds every attempt.
    static final int TIMEOUT_MS = 30000;
    // Largest response read: /status/v1/simple answers a few hundred bytes.
    static final int MAX_RESPONSE = 64 * 1024;

    public static void main(String[] args) throws Exception {
        if (args.length != 7) {
            System.err.println("usage: JdkResume ca.pem sni protocol clients resumptions source-ip vip:port");
            System.exit(2);
        }
        KeyStore trust = KeyStore.getInstance("PKCS12");
        trust.load(null, null);
        try (FileInputStream in = new FileInputStream(args[0])) {
            int i = 0;
            for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                trust.setCertificateEntry("ca" + i++, c);
            }
        }
        String sni = args[1];
        String protocol = args[2];
        int clients = Integer.parseInt(args[3]);
        int resumptions = Integer.parseInt(args[4]);
        InetSocketAddress source = new InetSocketAddress(args[5], 0);
        int colon = args[6].lastIndexOf(':');
        InetSocketAddress vip = new InetSocketAddress(args[6].substring(0, colon),
                Integer.parseInt(args[6].substring(colon + 1)));
        Thread[] threads = new Thread[clients];
        for (int c = 0; c < clients; c++) {
            final int id = c;
            threads[c] = new Thread(() -> client(id, trust, sni, protocol, resumptions, source, vip));
            threads[c].start();
        }
        for (Thread t : threads) {
            t.join();
        }
        System.out.println("DONE");
    }

    static void client(int id, KeyStore trust, String sni, String protocol, int resumptions,
            InetSocketAddress source, InetSocketAddress vip) {
        SSLContext ctx;
        try {
            TrustManagerFactory tmf = TrustManagerFactory.getInstance("PKIX");
            tmf.init(trust);
            ctx = SSLContext.getInstance("TLS");
            ctx.init(null, tmf.getTrustManagers(), null);
        } catch (Exception e) {
            System.out.println("ERROR " + id + " -1 " + e);
            return;
        }
        Certificate lastCert = null;
        long lastCreated = 0;
        for (int a = 0; a <= resumptions; a++) {
            try (Socket plain = new Socket()) {
                plain.bind(source);
                plain.connect(vip, TIMEOUT_MS);
                plain.setSoTimeout(TIMEOUT_MS);
                // The session cache key is sni:port, whatever address was dialled.
                SSLSocket s = (SSLSocket) ctx.getSocketFactory()
                        .createSocket(plain, sni, vip.getPort(), true);
                SSLParameters p = s.getSSLParameters();
                p.setServerNames(List.of(new SNIHostName(sni)));
                p.setEndpointIdentificationAlgorithm("HTTPS");
                p.setProtocols(new String[] {protocol});
                s.setSSLParameters(p);
                s.startHandshake();
                SSLSession sess = s.getSession();
                Certificate cert = sess.getPeerCertificates()[0];
                boolean resumed = cert == lastCert && sess.getCreationTime() == lastCreated;
                lastCert = cert;
                lastCreated = sess.getCreationTime();
                String status = get(s, sni);
                if (!status.equals("200 running")) {
                    System.out.println("ERROR " + id + " " + a + " http: " + status);
                    continue;
                }
                System.out.println("RESULT " + id + " " + a + " " + resumed + " "
                        + commonName((X509Certificate) cert) + " " + sess.getProtocol());
            } catch (Exception e) {
                System.out.println("ERROR " + id + " " + a + " " + e.toString().replace('\n', ' '));
            }
        }
    }

    // GET /status/v1/simple; "STATUS BODY" of the answer (the body trimmed).
    static String get(SSLSocket s, String host) throws Exception {
        OutputStream out = s.getOutputStream();
        // HTTP/1.0: the server closes after the answer and never chunks it.
        out.write(("GET /status/v1/simple HTTP/1.0\r\nHost: " + host + "\r\n\r\n")
                .getBytes(StandardCharsets.US_ASCII));
        out.flush();
        InputStream in = s.getInputStream();
        String resp = new String(in.readNBytes(MAX_RESPONSE), StandardCharsets.UTF_8);
        String[] head = resp.split("\r\n", 2);
        String[] statusLine = head[0].split(" ");
        int body = resp.indexOf("\r\n\r\n");
        String code = statusLine.length > 1 ? statusLine[1] : "?";
        return code + " " + (body < 0 ? "" : resp.substring(body + 4).trim());
    }

    // The CN of a certificate's subject, or the whole subject if it has none.
    static String commonName(X509Certificate cert) {
        String dn = cert.getSubjectX500Principal().getName();
        for (String part : dn.split(",")) {
            if (part.startsWith("CN=")) {
                return part.substring(3);
            }
        }
        return dn.replace(' ', '_');
    }
}
