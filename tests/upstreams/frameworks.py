#!/usr/bin/env python3
"""A login upstream for tests: reads the account (or tenant) of each request the way one
common framework is documented to, and counts the attempts per account it would log in as.

    frameworks.py --port P --reader go|aspnet|spring|flask|django|wsgi-tenant

POST <any path>          one attempt; answers {"account": ...} (the account read, or null)
GET /_attempts?account=A how many attempts reached the account the framework resolves A to

Readers (what each framework's login code sees of `username`, or of X-Tenant-Id):
  go          encoding/json decoding the body whatever its Content-Type; keys matched exactly
              or ignoring case with Go's folding (ASCII, 'ſ' as 's', 'K' as 'k'), the last
              match wins; strings.TrimSpace.
  aspnet      System.Text.Json with case-insensitive property names (ASP.NET Core's web
              defaults), the last match wins; Identity compares user names upper-cased.
  spring      Servlet getParameter (query string first, then the form body), as Spring
              Security's form login reads it, then String.trim() (every char <= U+0020).
  flask       request.values (query first, then the form) or request.get_json(), behind a
              gunicorn-style server (the last Content-Type header wins); str.strip().
  django      request.POST (the last value of a repeated field); AuthenticationForm's
              UsernameField: str.strip(), then NFKC.
  wsgi-tenant the WSGI environ (wsgiref: '-' and '_' both become '_', repeated headers
              joined with ','); the tenant is the first element of the list, stripped.
"""
import argparse
import json
import threading
import unicodedata
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

FIELD = "username"


def go_fold(name):
    out = []
    for c in name:
        if c == "\u017f":
            c = "s"
        elif c == "\u212a":
            c = "k"
        elif c.isascii():
            c = c.lower()
        out.append(c)
    return "".join(out)


def go_trim(value):
    return value.strip("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                       "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def json_pairs(body):
    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=lambda pairs: pairs)
    except ValueError:
        return None


def last_match(pairs, matches):
    found = None
    if isinstance(pairs, list):
        for key, value in pairs:
            if matches(key) and isinstance(value, str):
                found = value
    return found


def form(body):
    return parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)


def first(pairs):
    return next((v for k, v in pairs if k == FIELD), None)


def last(pairs):
    values = [v for k, v in pairs if k == FIELD]
    return values[-1] if values else None


def media(content_type):
    return (content_type or "").split(";")[0].strip().lower()


class Reader:
    """account(request) -> the name the framework's login acts on; identity(name) -> the
    account a user typing `name` is."""

    def __init__(self, kind):
        self.kind = kind

    def identity(self, name):
        if self.kind == "aspnet":
            return name.upper()
        if self.kind == "django":
            return unicodedata.normalize("NFKC", name.strip())
        return name

    def account(self, req):
        kind = self.kind
        if kind == "go":
            value = last_match(json_pairs(req.body), lambda k: k == FIELD or go_fold(k) == FIELD)
            return None if value is None else go_trim(value)
        if kind == "aspnet":
            if media(req.content_types[0] if req.content_types else "") != "application/json":
                return None
            value = last_match(json_pairs(req.body), lambda k: k.upper() == FIELD.upper())
            return None if value is None else value.upper()
        if kind == "spring":
            params = parse_qsl(req.query, keep_blank_values=True)
            if media(req.content_types[0] if req.content_types else "") == \
                    "application/x-www-form-urlencoded":
                params += form(req.body)
            value = first(params)
            return None if value is None else value.strip("".join(map(chr, range(0x21))))
        if kind == "flask":
            content_type = media(req.content_types[-1] if req.content_types else "")
            if content_type == "application/json":
                data = json.loads(req.body.decode("utf-8"))
                value = data.get(FIELD) if isinstance(data, dict) else None
            else:
                params = parse_qsl(req.query, keep_blank_values=True)
                if content_type == "application/x-www-form-urlencoded":
                    params += form(req.body)
                value = first(params)
            return value.strip() if isinstance(value, str) else None
        if kind == "django":
            if media(req.content_types[0] if req.content_types else "") != \
                    "application/x-www-form-urlencoded":
                return None
            value = last(form(req.body))
            return None if value is None else unicodedata.normalize("NFKC", value.strip())
        if kind == "wsgi-tenant":
            environ = {}
            for name, value in req.header_lines:
                key = "HTTP_" + name.replace("-", "_").upper()
                value = value.strip()
                environ[key] = environ[key] + "," + value if key in environ else value
            tenant = environ.get("HTTP_X_TENANT_ID")
            return None if tenant is None else tenant.split(",")[0].strip()
        raise ValueError(kind)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path != "/_attempts":
            return self.answer(404, {"error": "not found"})
        name = dict(parse_qsl(url.query)).get("account", "")
        account = self.server.reader.identity(name)
        with self.server.lock:
            count = self.server.attempts.get(account, 0)
        self.answer(200, {"account": account, "attempts": count})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length)
        url = urlsplit(self.path)
        self.query = url.query
        self.content_types = self.headers.get_all("Content-Type") or []
        self.header_lines = list(self.headers.items())
        try:
            account = self.server.reader.account(self)
        except (ValueError, UnicodeDecodeError, AttributeError):
            account = None
        if account is not None:
            with self.server.lock:
                self.server.attempts[account] = self.server.attempts.get(account, 0) + 1
        self.answer(200, {"account": account})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reader", required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.reader = Reader(args.reader)
    server.attempts = {}
    server.lock = threading.Lock()
    server.serve_forever()


if __name__ == "__main__":
    main()
