// Go's crypto/tls with its default ClientHello: for each server name, three
// connections from one tls.Config with a client session cache (a full handshake,
// then two resumptions), each read to the server's close so TLS 1.3 tickets
// arrive. Prints per connection "RESULT sni attempt resumed backend", where
// "resumed" is ConnectionState().DidResume, Go's own account.
//
// Usage: client ca.pem port sni...
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"time"
)

func main() {
	ca, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Println("ERROR - -1", err)
		return
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	port := os.Args[2]
	for _, sni := range os.Args[3:] {
		cfg := &tls.Config{RootCAs: pool, ServerName: sni, ClientSessionCache: tls.NewLRUClientSessionCache(4)}
		for a := 0; a < 3; a++ {
			d := &net.Dialer{Timeout: 15 * time.Second}
			c, err := tls.DialWithDialer(d, "tcp", "127.0.0.1:"+port, cfg)
			if err != nil {
				fmt.Println("ERROR", sni, a, strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			c.SetDeadline(time.Now().Add(15 * time.Second))
			io.WriteString(c, "GET /who HTTP/1.0\r\nHost: "+sni+"\r\nConnection: close\r\n\r\n")
			b, _ := io.ReadAll(io.LimitReader(c, 65536))
			resumed := c.ConnectionState().DidResume
			c.Close()
			parts := strings.SplitN(string(b), "\r\n\r\n", 2)
			fmt.Println("RESULT", sni, a, resumed, strings.TrimSpace(parts[len(parts)-1]))
		}
	}
	fmt.Println("VERSION go", runtime.Version())
}
