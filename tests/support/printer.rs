//! A real IPP printer for the tests: CUPS's `ippeveprinter` (Debian's
//! `cups-ipp-utils`), one process per [`TestPrinter`], listening on
//! localhost only, keeping every document it receives in its spool folder.
//!
//! `ippeveprinter` will not start without DNS-SD, that is without a running
//! `avahi-daemon`, which needs the system D-Bus. [`TestPrinter::start`]
//! starts both once per machine when they are not running (as root, as CI
//! runs): `dbus-daemon --system` and an `avahi-daemon` confined to the
//! loopback interface with publishing off, so nothing is announced on the
//! network. A lock file makes this safe when several test processes start
//! printers at once.
//!
//! The printer is colour, takes JPEG, PWG raster and Apple raster, has
//! letter paper in its main tray and 4x6 in its photo tray, and answers at
//! `ipp://127.0.0.1:PORT/ipp/print`. It takes one job at a time: a second
//! Print-Job while one is processing is refused with `server-error-busy`
//! ("Currently printing another job."). [`TestPrinter::start`] makes a fast
//! printer (each job runs `/bin/true` and completes in some 30 ms;
//! `ippeveprinter` alone sleeps a random 5 to 15 s per job);
//! [`TestPrinter::start_with_command`] runs a command of the test's own per
//! job (a script that sleeps makes a slow print; Cancel-Job of a job whose
//! command runs takes effect only when the command exits, the job showing
//! `processing-to-stop-point` meanwhile). When out of paper
//! ([`TestPrinter::set_media_ready`] with no media) the printer reports
//! `media-empty-report`, and a job sent then is taken (its document is in
//! the spool at once) but waits in `processing` while the printer says
//! `media-empty-warning` and `media-needed-warning`, until paper is loaded.
//! The printer forgets a job 60 s after it ended (Get-Job-Attributes then
//! answers `client-error-not-found`), and after [`TestPrinter::restart`]
//! job-ids start again from 1.
//!
//! Waiting is always on a condition with a deadline, never a blind sleep.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const INSTALL: &str = "apt-get install cups-ipp-utils avahi-daemon";
const DBUS_SOCKET: &str = "/run/dbus/system_bus_socket";
/// How long the daemons and a printer get to answer.
const START_DEADLINE: Duration = Duration::from_secs(20);
/// Polling interval while waiting on a condition.
const POLL: Duration = Duration::from_millis(50);

/// The avahi-daemon configuration for the tests: loopback only, no
/// publishing, no wide-area lookups.
const AVAHI_CONF: &str = "\
[server]
use-ipv4=yes
use-ipv6=no
allow-interfaces=lo
[wide-area]
enable-wide-area=no
[publish]
disable-publishing=yes
";

/// One `ippeveprinter`; killed on drop.
pub struct TestPrinter {
    /// `ipp://127.0.0.1:PORT/ipp/print`.
    pub uri: String,
    /// Where the printer keeps each document it receives, as `<job-id>-<job-name>.<ext>`
    /// (the name lower-cased, runs of other characters than letters, digits and `-` as one `_`).
    pub spool: PathBuf,
    pub port: u16,
    name: String,
    command: PathBuf,
    /// The document formats it takes (`-f`).
    formats: String,
    child: Option<Child>,
    /// Holds the spool and the printer's log (`printer.log`).
    dir: tempfile::TempDir,
}

impl TestPrinter {
    /// A fast printer: each job completes as soon as it is received.
    pub fn start(name: &str) -> TestPrinter {
        TestPrinter::start_with_command(name, Path::new("/bin/true"))
    }

    /// A printer that runs `cmd FILE` for each job (the job is processing
    /// until it exits; exiting non-zero aborts the job).
    pub fn start_with_command(name: &str, cmd: &Path) -> TestPrinter {
        TestPrinter::launched(name, cmd, "image/jpeg,image/pwg-raster,image/urf")
    }

    /// A fast printer that takes only `formats` (comma-separated MIME
    /// types), such as a printer that takes PWG raster and not JPEG.
    pub fn start_taking(name: &str, formats: &str) -> TestPrinter {
        TestPrinter::launched(name, Path::new("/bin/true"), formats)
    }

    fn launched(name: &str, cmd: &Path, formats: &str) -> TestPrinter {
        ensure_daemons();
        let dir = tempfile::Builder::new()
            .prefix("test-printer-")
            .tempdir()
            .expect("temp dir for the test printer");
        let spool = dir.path().join("spool");
        fs::create_dir(&spool).expect("spool dir");
        let mut printer = TestPrinter {
            uri: String::new(),
            spool,
            port: 0,
            name: name.to_owned(),
            command: cmd.to_owned(),
            formats: formats.to_owned(),
            child: None,
            dir,
        };
        // A free port can be taken by someone else before the printer binds
        // it: then the printer exits, and another port is tried.
        let mut failures = Vec::new();
        for _ in 0..5 {
            printer.port = free_port();
            printer.uri = format!("ipp://127.0.0.1:{}/ipp/print", printer.port);
            match printer.launch() {
                Ok(()) => return printer,
                Err(why) => failures.push(why),
            }
        }
        panic!(
            "the test printer {name:?} did not start:\n{}",
            failures.join("\n---\n")
        );
    }

    /// Kills the printer at once (`kill -9`): a printer switched off. Its
    /// jobs are lost; the spool keeps the documents.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the printer if it runs and starts it again, on the same port
    /// with the same spool. It comes back idle, with its default media
    /// loaded and no jobs: job-ids start again from 1.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(why) if Instant::now() >= deadline => {
                    panic!(
                        "the test printer {:?} did not restart on port {}:\n{why}",
                        self.name, self.port
                    )
                }
                Err(_) => std::thread::sleep(POLL),
            }
        }
    }

    /// The files in the spool, sorted by job-id (then name).
    pub fn documents(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = fs::read_dir(&self.spool)
            .expect("read the spool")
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.is_file())
            .collect();
        files.sort_by_key(|path| {
            let file = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let id: u64 = file
                .split('-')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(u64::MAX);
            (id, file)
        });
        files
    }

    /// Waits (at most `within`) until the printer holds `count` documents;
    /// whether it does.
    pub async fn holds_documents(&self, count: usize, within: Duration) -> bool {
        super::wait_for(within, || async {
            (self.documents().len() == count).then_some(())
        })
        .await
        .is_some()
    }

    /// A keyword or name attribute of job `job_id` as the printer keeps
    /// it (Get-Job-Attributes), such as the `print-color-mode` it was sent
    /// with; None when the printer does not say.
    pub fn job_attribute(&self, job_id: i32, name: &str) -> Option<String> {
        let mut body = vec![0x01, 0x01, 0x00, 0x09, 0, 0, 0, 1, 0x01];
        let attr = |body: &mut Vec<u8>, tag: u8, name: &str, value: &[u8]| {
            body.push(tag);
            body.extend_from_slice(&(name.len() as u16).to_be_bytes());
            body.extend_from_slice(name.as_bytes());
            body.extend_from_slice(&(value.len() as u16).to_be_bytes());
            body.extend_from_slice(value);
        };
        attr(&mut body, 0x47, "attributes-charset", b"utf-8");
        attr(&mut body, 0x48, "attributes-natural-language", b"en");
        attr(&mut body, 0x45, "printer-uri", self.uri.as_bytes());
        attr(&mut body, 0x21, "job-id", &job_id.to_be_bytes());
        attr(&mut body, 0x44, "requested-attributes", name.as_bytes());
        body.push(0x03);
        let mut request = format!(
            "POST /ipp/print HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Type: application/ipp\r\nContent-Length: {}\r\n\r\n",
            self.port,
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        let (_, answer) = exchange(self.port, &request).ok()?;
        // The attribute in the answer: its name, then a 2-byte length and
        // the value (the name's own length precedes it).
        let at = answer
            .windows(name.len())
            .position(|w| w == name.as_bytes())?
            + name.len();
        let len = u16::from_be_bytes(answer.get(at..at + 2)?.try_into().ok()?) as usize;
        String::from_utf8(answer.get(at + 2..at + 2 + len)?.to_vec()).ok()
    }

    /// Loads the printer's trays through its own web form (`GET
    /// /media?size1=..&type1=..&level1=..`, as its page submits it).
    ///
    /// `ready[0]` goes in the first tray (main), `ready[1]` in the second
    /// (photo); trays left over hold nothing. Loaded trays report an unknown
    /// sheet count, so no `media-low`. `media-ready` then lists `ready`.
    ///
    /// No media (`&[]`) is out of paper: every tray keeps the size it is set
    /// to (`media-ready` does not change, as on a real printer that knows how
    /// its trays are set up) but holds no sheets. The printer then reports
    /// `media-empty-report` in `printer-state-reasons` while idle, and
    /// `media-empty-warning` + `media-needed-warning` (state processing)
    /// while a job waits for paper; the job stays `processing`
    /// (`job-printing`) until media is loaded again, then completes. Loading
    /// media clears these reasons. (The trays are never all set to no size:
    /// ippeveprinter 2.4's media page cannot load anything after that.)
    pub fn set_media_ready(&self, ready: &[&str]) {
        let page = self
            .http_get("/media")
            .unwrap_or_else(|e| panic!("GET /media: {e}"));
        let trays = trays(&page);
        assert!(
            !trays.is_empty(),
            "no trays on the printer's media page:\n{page}"
        );
        assert!(
            ready.len() <= trays.len(),
            "the test printer has {} trays, not {}: {ready:?}",
            trays.len(),
            ready.len()
        );
        let mut query = Vec::new();
        for (n, tray) in trays.iter().enumerate() {
            let (size, level) = if ready.is_empty() {
                (tray.size.as_str(), 0)
            } else {
                (ready.get(n).copied().unwrap_or(""), -2)
            };
            query.push(format!(
                "size{i}={size}&type{i}={kind}&level{i}={level}",
                i = tray.index,
                kind = tray.kind
            ));
        }
        assert!(
            !ready.is_empty() || trays.iter().any(|t| !t.size.is_empty()),
            "no tray has a size to run out of"
        );
        let answer = self
            .http_get(&format!("/media?{}", query.join("&")))
            .unwrap_or_else(|e| panic!("setting media-ready to {ready:?}: {e}"));
        assert!(
            answer.contains("<form"),
            "the media form did not answer: {answer}"
        );
    }

    /// The printer's log so far (stdout and stderr of `ippeveprinter`).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("printer.log")
    }

    /// Starts `ippeveprinter` on `self.port` and waits until it answers IPP.
    fn launch(&mut self) -> Result<(), String> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("printer log");
        let child = Command::new(binary("ippeveprinter"))
            .arg("-n")
            .arg("localhost")
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-d")
            .arg(&self.spool)
            .arg("-k")
            .arg("-f")
            .arg(&self.formats)
            .arg("-s")
            .arg("10,10")
            .arg("-c")
            .arg(&self.command)
            // The command's standard output goes nowhere rather than into a
            // `.prn` file in the spool.
            .arg("-D")
            .arg("file:///dev/null")
            .arg(&self.name)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("printer log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run ippeveprinter ({INSTALL}): {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if ipp_answers(self.port, &self.uri) {
                return Ok(());
            }
            let child = self.child.as_mut().expect("child");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(format!(
                    "ippeveprinter exited ({status}) on port {}:\n{}",
                    self.port,
                    self.log()
                ));
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(format!(
                    "ippeveprinter did not answer on port {} in {START_DEADLINE:?}:\n{}",
                    self.port,
                    self.log()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// A plain HTTP GET to the printer's web server; the body.
    fn http_get(&self, path: &str) -> Result<String, String> {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        );
        let (head, body) = exchange(self.port, request.as_bytes())?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return Err(format!(
                "answered {}",
                head.lines().next().unwrap_or_default()
            ));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

impl Drop for TestPrinter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A tray of the printer's media page: its form number, and the size and
/// type selected now (empty for none).
struct Tray {
    index: u32,
    size: String,
    kind: String,
}

/// The trays of the media form (`<select name="sizeN">` and `typeN`), in page order.
fn trays(page: &str) -> Vec<Tray> {
    let selects: Vec<(String, String)> = page
        .split("<select name=\"")
        .skip(1)
        .filter_map(|rest| {
            let (name, body) = rest.split_once('"')?;
            let body = body.split("</select>").next().unwrap_or_default();
            let selected = body
                .split("<option")
                .find(|option| {
                    option
                        .split('>')
                        .next()
                        .unwrap_or_default()
                        .contains("selected")
                })
                .and_then(|option| option.split_once('>'))
                .map(|(_, text)| text.split('<').next().unwrap_or_default().to_owned())
                .unwrap_or_default();
            Some((name.to_owned(), selected))
        })
        .collect();
    let selected = |name: &str| {
        selects
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.clone())
            .unwrap_or_default()
    };
    selects
        .iter()
        .filter_map(|(name, _)| name.strip_prefix("size")?.parse::<u32>().ok())
        .map(|index| Tray {
            index,
            size: selected(&format!("size{index}")),
            kind: selected(&format!("type{index}")),
        })
        .collect()
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// Whether an IPP Get-Printer-Attributes to the printer is answered with
/// `successful-ok`.
fn ipp_answers(port: u16, uri: &str) -> bool {
    let mut body = vec![0x01, 0x01, 0x00, 0x0b, 0, 0, 0, 1, 0x01];
    let attr = |body: &mut Vec<u8>, tag: u8, name: &str, value: &str| {
        body.push(tag);
        body.extend_from_slice(&(name.len() as u16).to_be_bytes());
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(&(value.len() as u16).to_be_bytes());
        body.extend_from_slice(value.as_bytes());
    };
    attr(&mut body, 0x47, "attributes-charset", "utf-8");
    attr(&mut body, 0x48, "attributes-natural-language", "en");
    attr(&mut body, 0x45, "printer-uri", uri);
    attr(&mut body, 0x44, "requested-attributes", "printer-state");
    body.push(0x03);
    let mut request = format!(
        "POST /ipp/print HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Type: application/ipp\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    match exchange(port, &request) {
        Ok((head, body)) => head.contains(" 200") && body.len() >= 4 && body[2..4] == [0, 0],
        Err(_) => false,
    }
}

/// Sends `request` and reads the answer: the head, and the body by its
/// `Content-Length`, chunk by chunk, or to the end of the connection.
fn exchange(port: u16, request: &[u8]) -> Result<(String, Vec<u8>), String> {
    let mut stream =
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(request)
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 16384];
    let mut read_more = |answer: &mut Vec<u8>| -> Result<bool, String> {
        let n = stream.read(&mut buf).map_err(|e| format!("read: {e}"))?;
        answer.extend_from_slice(&buf[..n]);
        Ok(n > 0)
    };
    let head_end = loop {
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        if !read_more(&mut answer)? {
            return Err("closed before the end of the HTTP head".into());
        }
    };
    let head = String::from_utf8_lossy(&answer[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(key, _)| key.trim().eq_ignore_ascii_case(name))
            .map(|(_, value)| value.trim().to_ascii_lowercase())
    };
    let body_start = head_end + 4;
    if let Some(length) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while answer.len() < body_start + length {
            if !read_more(&mut answer)? {
                return Err("closed before the end of the body".into());
            }
        }
        return Ok((head, answer[body_start..body_start + length].to_vec()));
    }
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            if let Some(body) = dechunk(&answer[body_start..]) {
                return Ok((head, body));
            }
            if !read_more(&mut answer)? {
                return Err("closed before the last chunk".into());
            }
        }
    }
    while read_more(&mut answer)? {}
    Ok((head, answer[body_start..].to_vec()))
}

/// A whole chunked body, or None while its last chunk has not come.
fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        if data.len() < size + 2 {
            return None;
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// The path of a daemon's binary; panics saying what to install.
fn binary(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the test printer needs {name}, which is not installed: {INSTALL} \
                 (CUPS's ippeveprinter, with avahi-daemon and the system D-Bus it needs)"
            )
        })
}

/// Starts the system D-Bus and avahi-daemon unless they run; once per
/// process, and under a lock file against other test processes.
fn ensure_daemons() {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        // Every binary first, so a missing one is named before anything starts.
        for name in ["ippeveprinter", "avahi-daemon", "dbus-daemon"] {
            binary(name);
        }
        let lock = File::create(std::env::temp_dir().join("stagehand-test-printer.lock"))
            .expect("create the test printer lock file");
        lock.lock().expect("lock the test printer lock file");
        start_dbus();
        start_avahi();
        drop(lock);
    });
}

fn dbus_runs() -> bool {
    UnixStream::connect(DBUS_SOCKET).is_ok()
}

// The daemon is left running for later tests and test processes.
#[allow(clippy::zombie_processes)]
fn start_dbus() {
    if dbus_runs() {
        return;
    }
    fs::create_dir_all("/run/dbus")
        .unwrap_or_else(|e| panic!("mkdir /run/dbus (the test printer needs root): {e}"));
    // A socket left by a dead daemon would stop the new one from binding.
    let _ = fs::remove_file(DBUS_SOCKET);
    // In the foreground (`--nofork`) as a child of this process, never
    // waited for: it outlives the tests. A stale /run/dbus/pid would stop
    // a forking daemon; this one writes none.
    Command::new(binary("dbus-daemon"))
        .args(["--system", "--nofork", "--nopidfile"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start dbus-daemon ({INSTALL}): {e}"));
    wait_for("the system D-Bus (dbus-daemon --system)", dbus_runs);
}

fn avahi_runs() -> bool {
    Command::new(binary("avahi-daemon"))
        .arg("--check")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn start_avahi() {
    if avahi_runs() {
        return;
    }
    let conf = std::env::temp_dir().join("stagehand-test-avahi-daemon.conf");
    fs::write(&conf, AVAHI_CONF).expect("write the avahi-daemon configuration");
    let status = Command::new(binary("avahi-daemon"))
        .args(["--daemonize", "--no-drop-root", "--no-chroot", "--file"])
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot start avahi-daemon ({INSTALL}): {e}"));
    assert!(
        status.success(),
        "avahi-daemon --daemonize failed ({status}); is this root?"
    );
    wait_for("avahi-daemon", avahi_runs);
}

fn wait_for(what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + START_DEADLINE;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start in {START_DEADLINE:?}"
        );
        std::thread::sleep(POLL);
    }
}

/// A TCP proxy in front of a printer that can hold the printer's answers:
/// while held, every byte the printer sends back waits in the proxy (the
/// requests still reach the printer), so a test can kill stagehand after
/// the printer took a job and before stagehand heard its job id. The
/// printer behind it stays real; the proxy reads no IPP.
pub struct HoldingProxy {
    pub port: u16,
    hold: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl HoldingProxy {
    pub fn start(upstream_port: u16) -> HoldingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let hold = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let held = hold.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)) else {
                    continue;
                };
                let (client_in, server_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(client_in, server_out, None));
                let hold = held.clone();
                std::thread::spawn(move || pipe(server, client, Some(hold)));
            }
        });
        HoldingProxy { port, hold }
    }

    /// The printer's URI through the proxy.
    pub fn uri(&self) -> String {
        format!("ipp://127.0.0.1:{}/ipp/print", self.port)
    }

    pub fn hold(&self, held: bool) {
        self.hold.store(held, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either ends; with `hold`, nothing is
/// written while it is set (what was read waits).
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    hold: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while hold
            .as_ref()
            .is_some_and(|h| h.load(std::sync::atomic::Ordering::SeqCst))
        {
            std::thread::sleep(POLL);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}
