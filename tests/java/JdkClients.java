// Test clients for crossbar: N agents in parallel, each with its own SSLContext (so
// its own default client session cache), doing 1 + R HTTPS requests in sequence and
// alternating over the given addresses. Sessions are cached under the same
// host:port whatever address is dialled (the socket is layered over a plain one),
// as behind a VIP. Prints one line per attempt:
//   RESULT client attempt resumed backend      or     ERROR client attempt message
// "resumed" is the JDK's own view: the handshake's session carries the creation time
// and the very certificate object of the session the agent had before (a full
// handshake parses a new certificate; the JDK gives a TLS 1.3 resumption a new ID).
//
// Usage: java JdkClients.java truststore.p12 sni clients resumptions addr:port...
import java.io.FileInputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.security.KeyStore;
import java.util.Arrays;
import java.util.List;
import javax.net.ssl.SNIHostName;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSession;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManagerFactory;

public class JdkClients {
    static final int TIMEOUT_MS = 15000;

    public static void main(String[] args) throws Exception {
        KeyStore ts = KeyStore.getInstance("PKCS12");
        try (FileInputStream in = new FileInputStream(args[0])) {
            ts.load(in, "changeit".toCharArray());
        }
        String sni = args[1];
        int clients = Integer.parseInt(args[2]);
        int resumptions = Integer.parseInt(args[3]);
        List<String> addrs = Arrays.asList(args).subList(4, args.length);
        Thread[] threads = new Thread[clients];
        for (int c = 0; c < clients; c++) {
            final int id = c;
            threads[c] = new Thread(() -> agent(id, ts, sni, resumptions, addrs));
            threads[c].start();
        }
        for (Thread t : threads) {
            t.join();
        }
        System.out.println("DONE");
    }

    static void agent(int id, KeyStore ts, String sni, int resumptions, List<String> addrs) {
        SSLContext ctx;
        try {
            TrustManagerFactory tmf = TrustManagerFactory.getInstance("PKIX");
            tmf.init(ts);
            ctx = SSLContext.getInstance("TLS");
            ctx.init(null, tmf.getTrustManagers(), null);
        } catch (Exception e) {
            System.out.println("ERROR " + id + " -1 " + e);
            return;
        }
        java.security.cert.Certificate lastCert = null;
        long lastCreated = 0;
        for (int a = 0; a <= resumptions; a++) {
            String addr = addrs.get(a % addrs.size());
            int colon = addr.lastIndexOf(':');
            try (Socket plain = new Socket()) {
                plain.connect(new InetSocketAddress(addr.substring(0, colon),
                        Integer.parseInt(addr.substring(colon + 1))), TIMEOUT_MS);
                plain.setSoTimeout(TIMEOUT_MS);
                SSLSocket s = (SSLSocket) ctx.getSocketFactory()
                        .createSocket(plain, sni, 8140, true);
                SSLParameters p = s.getSSLParameters();
                p.setServerNames(List.of(new SNIHostName(sni)));
                p.setEndpointIdentificationAlgorithm("HTTPS");
                s.setSSLParameters(p);
                s.startHandshake();
                SSLSession sess = s.getSession();
                java.security.cert.Certificate cert = sess.getPeerCertificates()[0];
                boolean resumed = cert == lastCert && sess.getCreationTime() == lastCreated;
                lastCert = cert;
                lastCreated = sess.getCreationTime();
                OutputStream out = s.getOutputStream();
                out.write(("GET /who HTTP/1.1\r\nHost: " + sni + "\r\nConnection: close\r\n\r\n")
                        .getBytes(StandardCharsets.US_ASCII));
                out.flush();
                InputStream in = s.getInputStream();
                String resp = new String(in.readAllBytes(), StandardCharsets.UTF_8);
                String[] lines = resp.trim().split("\r?\n");
                String backend = lines[lines.length - 1].trim();
                System.out.println("RESULT " + id + " " + a + " " + resumed + " " + backend
                        + " " + sess.getProtocol());
            } catch (Exception e) {
                System.out.println("ERROR " + id + " " + a + " " + e.toString().replace('\n', ' '));
            }
        }
    }
}
