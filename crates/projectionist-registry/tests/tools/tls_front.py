"""An HTTPS front for a schema registry that asks for HTTP basic auth, as a hosted registry
does (Confluent Cloud: an API key and secret over TLS). GETs with the right credentials are
passed to the registry behind it, answers as they come; others get 401.

Usage: tls_front.py UPSTREAM CERT KEY USER PASSWORD
Prints the port it listens on (127.0.0.1), then serves until it is killed.
"""
import base64
import ssl
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

upstream, cert, key, user, password = sys.argv[1:6]
expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class Front(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get("Authorization") != expected:
            self.answer(401, b'{"error_code":401,"message":"Unauthorized"}', "application/json")
            return
        try:
            with urllib.request.urlopen(upstream + self.path, timeout=10) as r:
                self.answer(r.status, r.read(), r.headers.get("Content-Type"))
        except urllib.error.HTTPError as e:
            self.answer(e.code, e.read(), e.headers.get("Content-Type"))

    def answer(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type or "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Front)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
