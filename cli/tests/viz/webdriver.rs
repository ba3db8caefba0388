//! A tiny W3C WebDriver client over `std::net::TcpStream`: starts `chromedriver` on a free port, opens one headless
//! chromium session, and speaks HTTP/1.1 with `Connection: close` (one request per connection, no async stack).

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to install when the browser or its driver is missing.
const INSTALL: &str = "run .ci/run (as root), or `apt-get install -y chromium chromium-driver`";

/// The W3C key of an element reference in a response.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// `name` on $PATH, or the test fails saying how to install it.
fn find(names: &[&str]) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/lib/chromium")]) {
        for name in names {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!("{} not found on PATH: the viz browser test needs it; {INSTALL}", names.join(" or "))
}

/// A running chromedriver and one browser session on it; both end on drop.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    /// Starts chromedriver and a headless chromium session (no sandbox: CI runs as root).
    pub fn start() -> Browser {
        let driver_path = find(&["chromedriver"]);
        let chromium = find(&["chromium", "chromium-browser", "google-chrome"]);
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {INSTALL}", driver_path.display()));
        let mut browser = Browser { driver, port, session: String::new() };
        browser.wait_ready();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1000"],
            },
        }}});
        let created = browser.request("POST", "/session", Some(&capabilities));
        let session = created["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {created}"));
        browser.session = session.to_string();
        browser
    }

    /// Waits (up to 10 s) for chromedriver to answer `/status` as ready.
    fn wait_ready(&mut self) {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < Duration::from_secs(10) {
            match self.try_request("GET", "/status", None) {
                Ok(status) if status["ready"] == json!(true) => return,
                Ok(status) => last = status.to_string(),
                Err(error) => last = error,
            }
            if let Ok(Some(exit)) = self.driver.try_wait() {
                panic!("chromedriver exited ({exit}) before it was ready; {INSTALL}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("chromedriver did not answer on port {} within 10 s: {last}", self.port);
    }

    /// The response's `value`, or the test fails with the driver's error.
    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.try_request(method, path, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    fn try_request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
        let head = match body {
            Some(body) => format!(
                "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                self.port,
                body.to_string().len()
            ),
            None => format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n", self.port),
        };
        stream.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
        let body = read_response(&mut stream)?;
        let body = String::from_utf8_lossy(&body);
        let json: Value = serde_json::from_str(&body).map_err(|e| format!("{e} in {body:?}"))?;
        match json["value"].get("error") {
            Some(error) => Err(format!("{error}: {}", json["value"]["message"])),
            None => Ok(json["value"].clone()),
        }
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    pub fn open(&self, url: &str) {
        self.request("POST", &self.session_path("/url"), Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page and returns what it returns.
    pub fn eval(&self, script: &str, args: Value) -> Value {
        self.request("POST", &self.session_path("/execute/sync"), Some(&json!({ "script": script, "args": args })))
    }

    /// Clicks the element `selector` finds, as a user would (the driver scrolls it into view first).
    pub fn click(&self, selector: &str) {
        let query = json!({ "using": "css selector", "value": selector });
        let found = self.request("POST", &self.session_path("/element"), Some(&query));
        let id = found[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {selector}: {found}"));
        self.request("POST", &self.session_path(&format!("/element/{id}/click")), Some(&json!({})));
    }

    /// Presses and releases one key (WebDriver's code points: `\u{E012}` left, `\u{E014}` right).
    pub fn press(&self, key: char) {
        let key = key.to_string();
        let actions = json!({ "actions": [{ "type": "key", "id": "keyboard", "actions": [
            { "type": "keyDown", "value": key }, { "type": "keyUp", "value": key },
        ]}]});
        self.request("POST", &self.session_path("/actions"), Some(&actions));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.try_request("DELETE", &self.session_path(""), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A response's body: as long as its `Content-Length` says (chromedriver may keep the connection open), or, chunked,
/// up to its last chunk.
fn read_response(stream: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut response = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        let read = stream.read(&mut buffer).map_err(|e| e.to_string())?;
        response.extend_from_slice(&buffer[..read]);
        let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
            if read == 0 {
                return Err("the connection closed before the header ended".to_string());
            }
            continue;
        };
        let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
        let body = &response[split + 4..];
        let length = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|n| n.trim().parse().ok());
        let chunked = head.contains("transfer-encoding: chunked") || head.contains("transfer-encoding:chunked");
        match length {
            Some(length) if body.len() >= length => return Ok(body[..length].to_vec()),
            None if chunked && body.ends_with(b"0\r\n\r\n") => return Ok(unchunk(body)),
            None if !chunked && read == 0 => return Ok(body.to_vec()),
            _ if read == 0 => return Err("the connection closed before the body ended".to_string()),
            _ => {}
        }
    }
}

/// An HTTP chunked body, decoded.
fn unchunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..line]).ok().and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let tail = &rest[line + 2..];
        match size {
            Some(size) if size > 0 && tail.len() >= size => {
                out.extend_from_slice(&tail[..size]);
                rest = tail[size..].strip_prefix(b"\r\n").unwrap_or(&tail[size..]);
            }
            _ => break,
        }
    }
    out
}
