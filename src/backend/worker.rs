//! The client side of the implementation protocol (docs/protocol.md): one
//! long-lived worker process per declared implementation, JSON lines on its
//! stdin/stdout, tensors as safetensors files in a per-case directory.
//! A worker that crashes, hangs past its deadline, breaks the protocol or
//! returns the wrong tensors costs one error row: it is killed, its stderr
//! tail goes into the row, and it is started again for the next case.

use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{BackendError, Exec, RunOutput, Samples};
use crate::metrics::{POISON_BF16, POISON_BITS};
use crate::variants::external::wire::{self, WireDtype, WireOut, WirePass};
use crate::variants::external::{External, ImplDecl};
use crate::variants::{Job, OutTensor};

/// The protocol version this build speaks.
pub const PROTOCOL: u64 = 1;

/// Free memory /dev/shm must have to hold case files (a container's default
/// 64 MiB does not; the temp directory is used then).
const SHM_NEEDED: u64 = 16 << 30;

/// Bytes free on the file system holding `dir` (0 when unknown).
fn free_bytes(dir: &Path) -> u64 {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
            return 0;
        };
        // SAFETY: `c` is a NUL-terminated path that outlives the call and
        // `st` is a zeroed statvfs the call fills; nothing else is touched.
        unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            if libc::statvfs(c.as_ptr(), &mut st) == 0 {
                return st.f_bavail as u64 * st.f_frsize as u64;
            }
        }
        0
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        0
    }
}

/// Lines of a worker's stderr kept for error rows.
const STDERR_LINES: usize = 30;

/// What a worker said about itself in its hello.
#[derive(Clone, Debug, Default)]
pub struct Hello {
    pub version: String,
    pub device: String,
    /// `cpu` or `gpu`: a CPU worker's timings are host wall time, never judged.
    pub device_kind: String,
    pub l2_bytes: u64,
    pub contracts: Vec<String>,
    /// The whole reply, for run metadata.
    pub raw: Value,
}

/// Why a request failed.
enum Fault {
    /// The worker is gone or unusable (crash, hang, protocol violation):
    /// it is killed and started again for the next case.
    Fatal(String),
    /// The worker answered `ok: false`; it stays up.
    Refused(String),
    /// The worker answered `ok: false, unsupported: true`: its library
    /// cannot run the case (a skip, not an error); it stays up.
    Unsupported(String),
}

struct Worker {
    child: Child,
    stdin: mpsc::Sender<(String, mpsc::Sender<std::io::Result<()>>)>,
    lines: Receiver<std::io::Result<String>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    hello: Hello,
}

impl Worker {
    fn start(d: &ImplDecl) -> Result<Worker, String> {
        let mut cmd = Command::new(&d.command[0]);
        cmd.args(&d.command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(c) = &d.cwd {
            cmd.current_dir(c);
        }
        for (k, v) in &d.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start `{}` ({e}); check `impl.command` in {}",
                d.command.join(" "),
                d.source
            )
        })?;
        let stdin = writer(child.stdin.take().expect("piped"));
        let stdout = child.stdout.take().expect("piped");
        let stderr_pipe = child.stderr.take().expect("piped");
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let tail = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
                if let Ok(mut t) = tail.lock() {
                    if t.len() == STDERR_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            }
        });
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut s = String::new();
                match r.read_line(&mut s) {
                    Ok(0) => break,
                    Ok(_) => {
                        if tx.send(Ok(s)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        break;
                    }
                }
            }
        });
        let mut w = Worker {
            child,
            stdin,
            lines,
            stderr,
            hello: Hello::default(),
        };
        let reply = match w.request(
            &json!({"op": "hello", "protocol": PROTOCOL, "mlabench": env!("CARGO_PKG_VERSION")}),
            d.start_timeout_s,
        ) {
            Ok(r) => r,
            Err(Fault::Fatal(e) | Fault::Refused(e) | Fault::Unsupported(e)) => {
                let tail = w.stderr_tail();
                w.kill();
                return Err(format!("{e}{tail}"));
            }
        };
        let proto = reply.get("protocol").and_then(Value::as_u64);
        if proto != Some(PROTOCOL) {
            w.kill();
            return Err(format!(
                "it speaks protocol {}, mlabench speaks {PROTOCOL}; update the worker (docs/protocol.md)",
                proto.map_or("(none given)".to_string(), |p| p.to_string())
            ));
        }
        let contracts: Vec<String> = reply
            .get("contracts")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|c| c.as_str().map(String::from)).collect())
            .unwrap_or_default();
        if !contracts.iter().any(|c| c == d.contract.name()) {
            w.kill();
            return Err(format!(
                "it implements {:?}, not {} as {} declares",
                contracts,
                d.contract.name(),
                d.source
            ));
        }
        let dev = reply.get("device").cloned().unwrap_or(Value::Null);
        w.hello = Hello {
            version: reply.get("version").and_then(Value::as_str).unwrap_or("").to_string(),
            device: dev.get("name").and_then(Value::as_str).unwrap_or("").to_string(),
            device_kind: dev.get("kind").and_then(Value::as_str).unwrap_or("gpu").to_string(),
            l2_bytes: dev.get("l2_bytes").and_then(Value::as_u64).unwrap_or(0),
            contracts,
            raw: reply,
        };
        Ok(w)
    }

    /// One request and its reply, within `timeout_s`.
    fn request(&mut self, msg: &Value, timeout_s: f64) -> Result<Value, Fault> {
        let op = msg.get("op").and_then(Value::as_str).unwrap_or("?").to_string();
        let (ack, acked) = mpsc::channel();
        let sent = self.stdin.send((format!("{msg}\n"), ack)).is_ok();
        match acked.recv_timeout(Duration::from_secs_f64(timeout_s)) {
            Ok(Ok(())) if sent => {}
            Ok(Err(e)) => {
                return Err(Fault::Fatal(format!(
                    "`{op}`: the worker's stdin is closed ({e}){}",
                    self.exit_words()
                )))
            }
            _ => {
                return Err(Fault::Fatal(format!(
                    "`{op}`: the worker takes no input{}",
                    self.exit_words()
                )))
            }
        }
        let got = self.lines.recv_timeout(Duration::from_secs_f64(timeout_s));
        let text = match got {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return Err(Fault::Fatal(format!("`{op}`: reading the worker's stdout: {e}"))),
            Err(RecvTimeoutError::Timeout) => {
                return Err(Fault::Fatal(format!(
                    "`{op}`: no answer within {timeout_s} s (hung?); raise `impl.timeout_s` if the request is really that slow"
                )))
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Fault::Fatal(format!(
                    "`{op}`: the worker exited without answering{}",
                    self.exit_words()
                )))
            }
        };
        let v: Value = serde_json::from_str(text.trim()).map_err(|e| {
            Fault::Fatal(format!(
                "`{op}`: protocol violation: the answer is not one JSON object ({e}): {:.200}",
                text.trim()
            ))
        })?;
        match v.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(v),
            Some(false) if v.get("unsupported").and_then(Value::as_bool) == Some(true) => {
                Err(Fault::Unsupported(format!(
                    "`{op}`: the implementation cannot run this case: {}",
                    v.get("error").and_then(Value::as_str).unwrap_or("(no reason given)")
                )))
            }
            Some(false) => Err(Fault::Refused(format!(
                "`{op}`: the worker refused: {}",
                v.get("error").and_then(Value::as_str).unwrap_or("(no error message)")
            ))),
            None => Err(Fault::Fatal(format!(
                "`{op}`: protocol violation: the answer has no boolean `ok`: {:.200}",
                text.trim()
            ))),
        }
    }

    fn exit_words(&mut self) -> String {
        std::thread::sleep(Duration::from_millis(50));
        match self.child.try_wait() {
            Ok(Some(s)) => format!(" (it exited: {s})"),
            _ => String::new(),
        }
    }

    fn stderr_tail(&self) -> String {
        // Give the reader thread a moment to drain what a dying worker wrote.
        std::thread::sleep(Duration::from_millis(100));
        let t = self
            .stderr
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        if t.is_empty() {
            String::new()
        } else {
            format!("; worker stderr (last {} lines): {}", t.len(), t.join(" | "))
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let (ack, acked) = mpsc::channel();
            if self.stdin.send((format!("{}\n", json!({"op": "bye"})), ack)).is_ok() {
                let _ = acked.recv_timeout(Duration::from_millis(200));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}

/// The worker's stdin, written from a thread of its own that blocks
/// SIGPIPE: mlabench keeps the default SIGPIPE action for its own stdout
/// (`| head`), and a worker that died must cost an error row, not the run.
fn writer(stdin: ChildStdin) -> mpsc::Sender<(String, mpsc::Sender<std::io::Result<()>>)> {
    let (tx, rx) = mpsc::channel::<(String, mpsc::Sender<std::io::Result<()>>)>();
    std::thread::spawn(move || {
        #[cfg(unix)]
        // SAFETY: sigemptyset/sigaddset fill a local, zero-initialized set;
        // pthread_sigmask changes only this thread's mask. A SIGPIPE raised
        // by a write here stays pending on this thread and is never
        // delivered; the write returns EPIPE instead.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        let mut w = BufWriter::new(stdin);
        for (line, ack) in rx {
            let r = w.write_all(line.as_bytes()).and_then(|_| w.flush());
            let _ = ack.send(r);
        }
    });
    tx
}

/// The running workers of a run, one per implementation, started on first
/// use, and the directory their case files go to.
pub struct WorkerPool {
    workers: HashMap<String, Worker>,
    hellos: HashMap<String, Hello>,
    dir: PathBuf,
    /// The inputs written last, kept for the next implementation of the same case.
    written: Vec<(String, PathBuf)>,
    seq: u64,
}

impl WorkerPool {
    /// Case files go under `MLABENCH_WORKER_DIR`, else `/dev/shm` (memory,
    /// so a worker can map its inputs), else the temp directory.
    pub fn new() -> WorkerPool {
        let base = std::env::var_os("MLABENCH_WORKER_DIR")
            .map(PathBuf::from)
            .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| free_bytes(p) >= SHM_NEEDED))
            .unwrap_or_else(std::env::temp_dir);
        WorkerPool {
            workers: HashMap::new(),
            hellos: HashMap::new(),
            dir: base.join(format!("mlabench-worker-{}", std::process::id())),
            written: vec![],
            seq: 0,
        }
    }

    /// What the implementation's worker said in its hello, once started.
    pub fn hello(&self, name: &str) -> Option<&Hello> {
        self.hellos.get(name)
    }

    /// Starts an implementation's worker now (before any case), so a worker
    /// that cannot start is bad environment, not an error row per case.
    pub fn start(&mut self, d: &ImplDecl) -> Result<&Hello, String> {
        if !self.workers.contains_key(&d.name) {
            let w =
                Worker::start(d).map_err(|e| format!("implementation {}: the worker did not start: {e}", d.name))?;
            self.hellos.insert(d.name.clone(), w.hello.clone());
            self.workers.insert(d.name.clone(), w);
        }
        Ok(&self.hellos[&d.name])
    }

    /// One run of an external implementation: every pass loaded, run
    /// `exec.repeats` times with poisoned outputs, the timed pass timed.
    pub fn run(&mut self, ext: &External, job: &Job, exec: &Exec) -> Result<RunOutput, BackendError> {
        let d = &ext.decl;
        let passes = wire::passes(ext, job).map_err(BackendError::Failed)?;
        if !self.workers.contains_key(&d.name) {
            self.start(d).map_err(BackendError::Failed)?;
        }
        let result = self.run_passes(d, job, &passes, exec);
        if let Err(Fault::Fatal(_)) = &result {
            if let Some(mut w) = self.workers.remove(&d.name) {
                w.kill();
            }
        }
        result.map_err(|f| match f {
            Fault::Fatal(e) | Fault::Refused(e) => BackendError::Failed(format!("{}: {e}", d.name)),
            Fault::Unsupported(e) => BackendError::Unsupported(format!("{}: {e}", d.name)),
        })
    }

    fn run_passes(&mut self, d: &ImplDecl, job: &Job, passes: &[WirePass], exec: &Exec) -> Result<RunOutput, Fault> {
        let mut out = RunOutput {
            repeats: vec![Vec::new(); exec.repeats.max(1) - 1],
            ..Default::default()
        };
        for (k, pass) in passes.iter().enumerate() {
            let key = format!("{}#{}#{k}", job.case.id, pass.contract.name());
            let dir = self.inputs_dir(&key, pass).map_err(Fault::Fatal)?;
            let w = self
                .workers
                .get_mut(&d.name)
                .ok_or(Fault::Fatal("the worker is not running".into()))?;
            let fail = |w: &Worker, e: String| e + &w.stderr_tail();
            let load = json!({
                "op": "load",
                "case": job.case.id,
                "contract": pass.contract.name(),
                "dir": dir,
                "inputs": "inputs.safetensors",
                "params": pass.params,
                "outputs": pass.outputs.iter().map(|o| json!({"name": o.name, "dtype": o.dtype.name(), "shape": o.shape})).collect::<Vec<_>>(),
            });
            w.request(&load, d.timeout_s).map_err(|f| with_tail(f, w))?;
            for r in 0..exec.repeats.max(1) {
                let file = format!("out-{k}-{r}.safetensors");
                let _ = std::fs::remove_file(dir.join(&file));
                let req = json!({
                    "op": "run",
                    "outputs": file,
                    "poison": {"bf16": POISON_BF16, "f32": POISON_BITS},
                });
                w.request(&req, d.timeout_s).map_err(|f| with_tail(f, w))?;
                let got = read_outputs(&dir.join(&file), &pass.outputs).map_err(|e| Fault::Fatal(fail(w, e)))?;
                let _ = std::fs::remove_file(dir.join(&file));
                if r == 0 {
                    out.tensors.extend(got);
                } else {
                    out.repeats[r - 1].extend(got);
                }
            }
            if pass.timed && exec.timing.enabled {
                let hello = &w.hello;
                let cpu = hello.device_kind == "cpu";
                let t = &exec.timing;
                // A CPU worker is timed as the CPU backend is: one sample,
                // labelled host wall time and never judged.
                let req = json!({
                    "op": "time",
                    "warmup": if cpu { 0 } else { t.warmup },
                    "min_samples": if cpu { 1 } else { t.min_samples },
                    "min_time_ms": if cpu { 0.0 } else { t.min_time_ms },
                    "max_samples": if cpu { 1 } else { 100_000 },
                    "target_noise": if cpu { None } else { t.target_noise },
                    "max_time_ms": t.max_time_ms,
                    "cold_l2": t.cold_l2,
                    "l2_flush_bytes": if hello.l2_bytes > 0 { 2 * hello.l2_bytes } else { 256 << 20 },
                    "graph": t.graph,
                    "sampling": t.sampling.name(),
                });
                let timeout = d.timeout_s.max((t.min_time_ms + t.max_time_ms) / 1e3 * 4.0 + 10.0);
                let reply = w.request(&req, timeout).map_err(|f| with_tail(f, w))?;
                out.samples = Some(samples(&reply, if cpu { 1 } else { t.min_samples }).map_err(Fault::Fatal)?);
            }
            let _ = w.request(&json!({"op": "unload"}), d.timeout_s);
        }
        out.notes.push(format!(
            "{} {}",
            d.name,
            self.hellos.get(&d.name).map_or("", |h| h.version.as_str())
        ));
        Ok(out)
    }

    /// The directory holding this pass's inputs, written once per case and
    /// pass: two implementations of one case read the same files.
    fn inputs_dir(&mut self, key: &str, pass: &WirePass) -> Result<PathBuf, String> {
        if let Some((_, d)) = self.written.iter().find(|(k, _)| k == key) {
            return Ok(d.clone());
        }
        // Inputs of the previous case are no longer needed.
        if !self
            .written
            .iter()
            .any(|(k, _)| k.split('#').next() == key.split('#').next())
        {
            for (_, d) in self.written.drain(..) {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        self.seq += 1;
        let d = self.dir.join(format!("c{}", self.seq));
        std::fs::create_dir_all(&d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        write_safetensors(&d.join("inputs.safetensors"), pass)
            .map_err(|e| format!("writing the inputs into {}: {e}", d.display()))?;
        self.written.push((key.to_string(), d.clone()));
        Ok(d)
    }
}

impl Default for WorkerPool {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.workers.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn with_tail(f: Fault, w: &Worker) -> Fault {
    match f {
        Fault::Fatal(e) => Fault::Fatal(e + &w.stderr_tail()),
        other => other,
    }
}

/// The timed samples of a `time` reply, checked: enough of them, each a
/// positive finite number of milliseconds.
fn samples(reply: &Value, min: usize) -> Result<Samples, String> {
    let v = reply
        .get("samples_ms")
        .and_then(Value::as_array)
        .ok_or("`time`: protocol violation: no `samples_ms` array")?;
    let ms: Vec<f64> = v.iter().filter_map(Value::as_f64).collect();
    if ms.len() != v.len() || ms.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return Err("`time`: protocol violation: `samples_ms` must hold positive finite numbers".into());
    }
    if ms.len() < min {
        return Err(format!("`time`: {} samples returned, {min} asked for", ms.len()));
    }
    let clock = reply
        .get("clock")
        .and_then(Value::as_str)
        .unwrap_or("worker")
        .to_string();
    Ok(Samples {
        kernel_ms: vec![],
        variant_ms: ms,
        clock,
        regions: Vec::new(),
    })
}

/// The inputs as one safetensors file, written straight from the borrowed
/// tensors (a pool can be gigabytes: no second copy in memory).
fn write_safetensors(path: &Path, pass: &WirePass) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut at = 0usize;
    for t in &pass.tensors {
        let n: usize = t.shape.iter().product::<usize>() * t.dtype.size();
        if n != t.data.len() {
            return Err(std::io::Error::other(format!(
                "tensor {} has shape {:?} but {} bytes",
                t.name,
                t.shape,
                t.data.len()
            )));
        }
        header.insert(
            t.name.to_string(),
            json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [at, at + n]}),
        );
        at += n;
    }
    header.insert(
        "__metadata__".into(),
        json!({"format": "mlabench-impl", "protocol": PROTOCOL.to_string()}),
    );
    let mut h = serde_json::to_vec(&Value::Object(header)).map_err(std::io::Error::other)?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut f = BufWriter::with_capacity(1 << 22, std::fs::File::create(path)?);
    f.write_all(&(h.len() as u64).to_le_bytes())?;
    f.write_all(&h)?;
    for t in &pass.tensors {
        f.write_all(&t.data)?;
    }
    f.flush()
}

/// The outputs a worker wrote, held to the contract's names, dtypes and
/// shapes, as the checks' f32 tensors.
fn read_outputs(path: &Path, want: &[WireOut]) -> Result<Vec<OutTensor>, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| format!("`run`: no output file {} ({e})", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("`run`: {} is not a safetensors file: {e}", path.display()))?;
    let mut out = Vec::new();
    for w in want {
        let t = st
            .tensor(w.name)
            .map_err(|_| format!("`run`: the outputs hold no `{}` tensor", w.name))?;
        let dt = format!("{:?}", t.dtype());
        if dt != w.dtype.name() {
            return Err(format!(
                "`run`: `{}` is {dt}, the contract says {}",
                w.name,
                w.dtype.name()
            ));
        }
        if t.shape() != w.shape.as_slice() {
            return Err(format!(
                "`run`: `{}` has shape {:?}, the contract says {:?}",
                w.name,
                t.shape(),
                w.shape
            ));
        }
        let raw = t.data();
        let data: Vec<f32> = match w.dtype {
            WireDtype::Bf16 => raw
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            WireDtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => return Err(format!("`run`: outputs of type {} are not read", other.name())),
        };
        let row_len: usize = w.shape[1..].iter().product();
        let data = match &w.scatter {
            None => data,
            Some((ids, rows)) => {
                let mut full = vec![f32::from_bits(POISON_BITS); rows * row_len];
                for (k, &i) in ids.iter().enumerate() {
                    full[i * row_len..(i + 1) * row_len].copy_from_slice(&data[k * row_len..(k + 1) * row_len]);
                }
                full
            }
        };
        out.push(OutTensor {
            name: w.check_name.clone(),
            row_len,
            data,
        });
    }
    Ok(out)
}
