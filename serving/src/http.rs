//! A small, bounded HTTP/1.1 layer for `megatron serve`: one request per connection
//! (`Connection: close`), every size checked before anything is allocated or read.
//!
//! Why our own: the library used before answered an oversized `Content-Length` with a 400 and
//! then drained the body into a buffer of that size, so one client could abort the server.
//! Here nothing is sized from client input before the limits below are checked:
//! - request line + headers at most [`Limits::max_header_bytes`] and [`Limits::max_headers`]
//!   lines → 431 otherwise;
//! - a body at most [`Limits::max_body_bytes`] (by `Content-Length` or the running total of
//!   chunks) → 413 otherwise, and the body is never read;
//! - versions other than HTTP/1.0 and 1.1 → 505; `Transfer-Encoding` other than `chunked` → 501;
//!   `Expect` other than `100-continue` → 417; anything malformed → 400;
//! - a whole request must arrive within [`Limits::request_deadline`] (slow clients cannot hold
//!   an HTTP thread forever: [`Deadline`] under the buffered reader) → 408.

use std::io::{BufRead, Read, Write};
use std::time::{Duration, Instant};

/// What one request may use.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub max_body_bytes: usize,
    pub request_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 16 << 10,
            max_headers: 64,
            max_body_bytes: 4 << 20,
            request_deadline: Duration::from_secs(30),
        }
    }
}

/// A parsed request (the header names are lower-cased).
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// Why a request was refused: the status to answer with and a message for the JSON body.
/// `status == 0` means the client went away (or timed out): nothing is answered.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpError {
    pub status: u16,
    pub message: String,
}

fn err(status: u16, message: impl Into<String>) -> HttpError {
    HttpError { status, message: message.into() }
}

fn io_err(e: std::io::Error) -> HttpError {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    // A socket read timeout (WouldBlock on Unix) or the request deadline: the client is still
    // there but too slow, and is told so; other errors mean it went away.
    let status = if matches!(e.kind(), TimedOut | WouldBlock) { 408 } else { 0 };
    err(status, format!("connection: {e}"))
}

/// A reader that fails with `TimedOut` once `until` has passed: with the socket's per-read
/// timeout this bounds a whole request, however slowly its bytes trickle in.
pub struct Deadline<R> {
    pub inner: R,
    until: Instant,
}

impl<R> Deadline<R> {
    pub fn new(inner: R, limit: Duration) -> Deadline<R> {
        Deadline { inner, until: Instant::now() + limit }
    }
}

impl<R: Read> Read for Deadline<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if Instant::now() > self.until {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "request deadline passed"));
        }
        self.inner.read(buf)
    }
}

/// Reads one line ending in `\n` (CR stripped), charging its bytes to `budget`; `over` is the
/// status when the budget runs out. Reads byte-bounded: `take` stops a line with no end.
fn read_line(r: &mut impl BufRead, budget: &mut usize, over: u16, what: &str) -> Result<String, HttpError> {
    let mut line = Vec::new();
    let n = r.by_ref().take(*budget as u64 + 1).read_until(b'\n', &mut line).map_err(io_err)?;
    if n > *budget {
        return Err(err(over, format!("{what} larger than {} bytes", *budget)));
    }
    *budget -= n;
    if n == 0 || line.last() != Some(&b'\n') {
        return Err(err(0, "connection closed in the middle of the request"));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| err(400, format!("{what} is not valid UTF-8")))
}

fn check_deadline(start: Instant, limits: &Limits) -> Result<(), HttpError> {
    if start.elapsed() > limits.request_deadline {
        return Err(err(408, format!("request not complete within {:?}", limits.request_deadline)));
    }
    Ok(())
}

/// Reads and validates one request. `w` receives the `100 Continue` interim answer.
pub fn read_request(r: &mut impl BufRead, w: &mut impl Write, limits: &Limits) -> Result<Request, HttpError> {
    let start = Instant::now();
    let mut budget = limits.max_header_bytes;
    let mut line = read_line(r, &mut budget, 431, "request line and headers")?;
    // RFC 9112 §2.2: ignore empty lines before the request line (bounded by the budget).
    while line.is_empty() {
        line = read_line(r, &mut budget, 431, "request line and headers")?;
    }
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, path, version] = parts[..] else {
        return Err(err(400, "malformed request line; expected `METHOD /path HTTP/1.1`"));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) || !path.starts_with('/') {
        return Err(err(400, "malformed request line; expected `METHOD /path HTTP/1.1`"));
    }
    match version {
        "HTTP/1.1" | "HTTP/1.0" => {}
        v if v.starts_with("HTTP/") && v.len() <= 16 => {
            return Err(err(505, format!("HTTP version {v} not supported; use HTTP/1.1")))
        }
        _ => return Err(err(400, "malformed request line; expected `METHOD /path HTTP/1.1`")),
    }
    let mut headers = Vec::new();
    loop {
        check_deadline(start, limits)?;
        let line = read_line(r, &mut budget, 431, "request line and headers")?;
        if line.is_empty() {
            break;
        }
        if headers.len() == limits.max_headers {
            return Err(err(431, format!("more than {} header lines", limits.max_headers)));
        }
        if line.starts_with([' ', '\t']) {
            return Err(err(400, "obsolete header line folding is not accepted"));
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(err(400, format!("malformed header line (no `:`): {:.60}", line)));
        };
        if name.is_empty() || name.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(err(400, format!("malformed header name: {:.60}", name)));
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    fn get<'a>(headers: &'a [(String, String)], n: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        headers.iter().filter(move |(k, _)| k == n).map(|(_, v)| v.as_str())
    }
    let lengths: Vec<&str> = get(&headers, "content-length").collect();
    let te: Vec<&str> = get(&headers, "transfer-encoding").collect();
    let chunked = match te.as_slice() {
        [] => false,
        [v] if v.eq_ignore_ascii_case("chunked") => true,
        _ => return Err(err(501, format!("Transfer-Encoding {} not supported; send Content-Length", te.join(", ")))),
    };
    if chunked && !lengths.is_empty() {
        return Err(err(400, "both Content-Length and Transfer-Encoding given"));
    }
    let length = match lengths.as_slice() {
        [] => 0usize,
        [first, rest @ ..] => {
            if rest.iter().any(|v| v != first) {
                return Err(err(400, "conflicting Content-Length headers"));
            }
            if first.is_empty() || first.len() > 20 || !first.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err(400, format!("Content-Length is not a number: {first:.40}")));
            }
            match first.parse::<u64>() {
                Ok(n) if n <= limits.max_body_bytes as u64 => n as usize,
                _ => return Err(err(413, format!("request body larger than {} bytes", limits.max_body_bytes))),
            }
        }
    };
    if let Some(e) = get(&headers, "expect").next() {
        if !e.eq_ignore_ascii_case("100-continue") {
            return Err(err(417, format!("Expect: {e:.40} not supported")));
        }
        w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").and_then(|_| w.flush()).map_err(io_err)?;
    }
    let body = if chunked { read_chunked(r, start, limits)? } else { read_exact_body(r, length)? };
    let (method, path) = (method.to_string(), path.to_string());
    Ok(Request { method, path, headers, body })
}

/// `length` is already checked against the limit.
fn read_exact_body(r: &mut impl BufRead, length: usize) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::with_capacity(length);
    r.by_ref().take(length as u64).read_to_end(&mut body).map_err(io_err)?;
    if body.len() < length {
        return Err(err(0, "connection closed before the whole body arrived"));
    }
    Ok(body)
}

fn read_chunked(r: &mut impl BufRead, start: Instant, limits: &Limits) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    let mut line_budget = limits.max_header_bytes;
    loop {
        check_deadline(start, limits)?;
        let line = read_line(r, &mut line_budget, 431, "chunk size lines")?;
        let size_hex = line.split(';').next().unwrap_or("").trim();
        if size_hex.is_empty() || size_hex.len() > 16 {
            return Err(err(400, format!("malformed chunk size: {size_hex:.20}")));
        }
        let size =
            u64::from_str_radix(size_hex, 16).map_err(|_| err(400, format!("malformed chunk size: {size_hex:.20}")))?;
        if size == 0 {
            break;
        }
        if size > (limits.max_body_bytes - body.len()) as u64 {
            return Err(err(413, format!("request body larger than {} bytes", limits.max_body_bytes)));
        }
        body.extend(read_exact_body(r, size as usize)?);
        if !read_line(r, &mut line_budget, 431, "chunk size lines")?.is_empty() {
            return Err(err(400, "chunk data not followed by CRLF"));
        }
    }
    // Trailer fields, ignored, up to the empty line.
    while !read_line(r, &mut line_budget, 431, "chunk trailers")?.is_empty() {
        check_deadline(start, limits)?;
    }
    Ok(body)
}

/// The reason phrase of the statuses this server sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// Writes a complete JSON response and announces that the connection closes.
pub fn write_json(w: &mut (impl Write + ?Sized), status: u16, body: &str) -> std::io::Result<()> {
    write!(
        w,
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    )?;
    w.write_all(body.as_bytes())?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> (Result<Request, HttpError>, Vec<u8>) {
        let limits = Limits { max_header_bytes: 256, max_headers: 4, max_body_bytes: 32, ..Limits::default() };
        let mut out = Vec::new();
        (read_request(&mut &raw[..], &mut out, &limits), out)
    }

    fn status(raw: &[u8]) -> u16 {
        match parse(raw).0 {
            Ok(_) => 200,
            Err(e) => e.status,
        }
    }

    #[test]
    fn good_requests() {
        let r = parse(b"PUT /api HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcdEXTRA").0.unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str(), &r.body[..]), ("PUT", "/api", &b"abcd"[..]));
        assert_eq!(r.header("host"), Some("x"));
        let r = parse(
            b"PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n",
        )
        .0
        .unwrap();
        assert_eq!(r.body, b"abcde");
        let (r, out) = parse(b"PUT /api HTTP/1.1\nExpect: 100-continue\nContent-Length: 1\n\nz");
        assert_eq!((r.unwrap().body, out), (b"z".to_vec(), b"HTTP/1.1 100 Continue\r\n\r\n".to_vec()));
        assert_eq!(parse(b"\r\nGET /health HTTP/1.0\r\n\r\n").0.unwrap().body, b"");
    }

    #[test]
    fn limits_and_malformed_requests() {
        // A huge Content-Length is refused before any body is read or allocated.
        assert_eq!(status(b"PUT /api HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n"), 413);
        assert_eq!(status(b"PUT /api HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n"), 400);
        assert_eq!(status(b"PUT /api HTTP/1.1\r\nContent-Length: 33\r\n\r\n"), 413);
        assert_eq!(status(b"PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n21\r\n"), 413);
        assert_eq!(status(b"PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n"), 413);
        assert_eq!(status(b"PUT /api HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"), 501);
        assert_eq!(status(b"PUT /api HTTP/1.1\r\nExpect: magic\r\n\r\n"), 417);
        assert_eq!(status(b"PUT /api HTTP/2.0\r\n\r\n"), 505);
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(300));
        assert_eq!(status(long.as_bytes()), 431);
        assert_eq!(status(b"GET / HTTP/1.1\r\na: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\ne: 1\r\n\r\n"), 431);
        for bad in [
            &b"GET\r\n\r\n"[..],
            b"get / HTTP/1.1\r\n\r\n",
            b"GET nopath HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nnocolon\r\n\r\n",
            b"GET / HTTP/1.1\r\n folded: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
            b"GET /\xff HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(status(bad), 400, "{}", String::from_utf8_lossy(bad));
        }
        // A request trickling in after its deadline: 408.
        let limits = Limits { request_deadline: Duration::from_millis(1), ..Limits::default() };
        let mut slow = std::io::BufReader::with_capacity(
            1,
            Deadline::new(&b"GET / HTTP/1.1\r\n\r\n"[..], limits.request_deadline),
        );
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(read_request(&mut slow, &mut Vec::new(), &limits).unwrap_err().status, 408);
        // Cut-off requests: no answer (the client is gone).
        for cut in [&b""[..], b"GET / HTTP/1.1\r\nHost", b"PUT / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"] {
            assert_eq!(status(cut), 0, "{}", String::from_utf8_lossy(cut));
        }
    }
}
