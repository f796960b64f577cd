// Test backends for crossbar: several HTTPS servers in one JVM, each on its own
// loopback port with its own certificate (PKCS#12) and the JDK's default session
// settings. Answers every request with the backend's name. Prints "LISTEN name port"
// per server, then "READY"; exits when stdin closes (the test ends it that way).
//
// Usage: java JdkServers name=keystore.p12[@host:port] ...   (keystore password: "changeit";
// without @host:port a server listens on a free loopback port)
import com.sun.net.httpserver.HttpsConfigurator;
import com.sun.net.httpserver.HttpsServer;
import java.io.FileInputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.security.KeyStore;
import java.util.concurrent.Executors;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;

public class JdkServers {
    public static void main(String[] args) throws Exception {
        char[] pass = "changeit".toCharArray();
        for (String arg : args) {
            String name = arg.substring(0, arg.indexOf('='));
            String file = arg.substring(arg.indexOf('=') + 1);
            InetSocketAddress bind = new InetSocketAddress("127.0.0.1", 0);
            int at = file.lastIndexOf('@');
            if (at >= 0) {
                String hp = file.substring(at + 1);
                int colon = hp.lastIndexOf(':');
                bind = new InetSocketAddress(hp.substring(0, colon), Integer.parseInt(hp.substring(colon + 1)));
                file = file.substring(0, at);
            }
            KeyStore ks = KeyStore.getInstance("PKCS12");
            try (FileInputStream in = new FileInputStream(file)) {
                ks.load(in, pass);
            }
            KeyManagerFactory kmf = KeyManagerFactory.getInstance("SunX509");
            kmf.init(ks, pass);
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(kmf.getKeyManagers(), null, null);
            HttpsServer s = HttpsServer.create(bind, 128);
            s.setHttpsConfigurator(new HttpsConfigurator(ctx));
            byte[] body = (name + "\n").getBytes(StandardCharsets.UTF_8);
            s.createContext("/", ex -> {
                ex.getResponseHeaders().add("Connection", "close");
                ex.sendResponseHeaders(200, body.length);
                try (OutputStream out = ex.getResponseBody()) {
                    out.write(body);
                }
            });
            // A thread per connection in handshake, as many as it takes. This
            // server does the TLS handshake blocking on its executor's thread, so a
            // connection whose handshake waits for the client's Finished holds one.
            // Placement confirmation holds a backend's answer (and so its thread)
            // while it offers the hello to another backend; with a small fixed pool
            // (8 threads), 32 agents confirming at once could take every thread of
            // every backend and wait on each other until timeouts.server_hello,
            // which took all three down (passive health) and refused clients. Real
            // masters (Jetty) handshake without holding a thread, so they do not
            // starve that way.
            s.setExecutor(Executors.newCachedThreadPool());
            s.start();
            System.out.println("LISTEN " + name + " " + s.getAddress().getPort());
        }
        System.out.println("READY");
        System.out.flush();
        while (System.in.read() >= 0) {
        }
        System.exit(0);
    }
}
