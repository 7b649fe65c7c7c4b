//! The output folder of `cvc train`: its files, the lock that keeps two runs out of one
//! folder, the cleaning of crashed runs' temporaries, and the choice (and repair) of the
//! checkpoint a `--resume` continues from.
//!
//! Files: `metrics.jsonl` (one JSON record per finished epoch), `last.safetensors` (the
//! state after the latest finished epoch), `best.safetensors` (the state after the best
//! epoch so far), `train.lock` (the pid of the run holding the folder, removed when it ends),
//! and, only while a file is being replaced, `.<name>.tmp-<pid>`. The lock is an `flock(2)`
//! on `train.lock`, which the kernel releases when the process ends, however it ends.
//!
//! Invariant of the checkpoint pair. Each checkpoint is replaced atomically (temporary file,
//! fsync, rename, fsync of the folder: [`crate::checkpoint::write_atomic`]), and an epoch
//! writes `best` (when it improved) *before* `last`, then appends its metrics line, then
//! prints. So after a crash at any point:
//! - `best.safetensors` holds the best epoch among those up to the newest checkpoint on
//!   disk: it is never older than the best epoch `last` records;
//! - either both files are from the same (or a consistent earlier) state, or `best` is one
//!   epoch ahead of `last` (the crash fell between the two renames). Both files hold the whole
//!   training state, so `--resume` then continues from `best` and rewrites `last` from it
//!   ([`resume_point`] says so in a note);
//! - `metrics.jsonl` may lack the newest checkpoint's line (the crash fell between the
//!   checkpoint and the line) or hold lines of epochs no checkpoint has reached; every
//!   checkpoint carries its epoch's record in its metadata (`metrics`), so `--resume` cuts
//!   the file back to the checkpoint's epoch and restores that line ([`repair_metrics`]).
//!
//! Test-only fault injection: with `CVC_CRASH_AFTER=POINT` (or `POINT:N`, the `N`th time,
//! 1-based) the process aborts at that point, as a crash would leave it. The points are
//! `<stem>.tmp` (a temporary file written and synced, not yet renamed) and `<stem>` (renamed)
//! for every atomic write (`best`, `last`, `metrics` when a resume rewrites it), and
//! `metrics.line` (an epoch's line appended). See [`crash_point`].

use crate::checkpoint::{self, Checkpoint};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The metrics file.
pub const METRICS: &str = "metrics.jsonl";
/// The checkpoint after the latest finished epoch.
pub const LAST: &str = "last.safetensors";
/// The checkpoint after the best epoch so far.
pub const BEST: &str = "best.safetensors";
/// The lock file (holds the pid of the run that owns the folder).
pub const LOCK: &str = "train.lock";
/// The plan of the training step, for `cvc report` (written once training ends).
pub const PLAN: &str = "plan.json";

/// Environment variable of the test-only fault injection ([`crash_point`]).
pub const CRASH_ENV: &str = "CVC_CRASH_AFTER";

/// How a run treats an existing output folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// The folder must be empty or absent.
    Fresh,
    /// Continue the run in the folder (`--resume`).
    Resume,
    /// Replace the run's files in the folder (`--overwrite`); other files are left alone.
    Overwrite,
}

/// An output folder held by this process: the lock file is removed on drop.
#[derive(Debug)]
pub struct RunDir {
    dir: PathBuf,
    lock: PathBuf,
    /// The open lock file: the lock lasts while it is open.
    _lock_file: File,
}

impl RunDir {
    /// Creates (if needed) and locks `dir`, removes temporaries that crashed runs left, and
    /// applies `reuse`. Notes for the user (a stale lock taken over, temporaries removed) are
    /// written to stderr.
    pub fn open(dir: &Path, reuse: Reuse) -> Result<RunDir, String> {
        fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the output folder {}: {e}", dir.display()))?;
        let (lock, file) = take_lock(dir)?;
        let held = RunDir { dir: dir.to_path_buf(), lock, _lock_file: file };
        // Only the lock's holder writes here, so every temporary is a crashed run's.
        let mut removed = Vec::new();
        for name in held.entries()? {
            if is_temporary(&name) {
                let p = dir.join(&name);
                fs::remove_file(&p).map_err(|e| format!("cannot remove {}: {e}", p.display()))?;
                removed.push(name);
            }
        }
        if !removed.is_empty() {
            note(&format!(
                "removed {} temporary file{} of an interrupted run in {}: {}",
                removed.len(),
                if removed.len() == 1 { "" } else { "s" },
                dir.display(),
                removed.join(", ")
            ));
        }
        match reuse {
            Reuse::Resume => {}
            Reuse::Fresh => {
                let others: Vec<String> = held.entries()?.into_iter().filter(|n| n != LOCK).collect();
                if !others.is_empty() {
                    let shown = others.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
                    let more = if others.len() > 4 {
                        format!(" and {} more", others.len() - 4)
                    } else {
                        String::new()
                    };
                    return Err(format!(
                        "the output folder {} is not empty ({shown}{more}): continue its run with --resume, \
                         replace it with --overwrite, or choose another folder with --out",
                        dir.display()
                    ));
                }
            }
            Reuse::Overwrite => {
                for name in [METRICS, LAST, BEST, PLAN] {
                    let p = dir.join(name);
                    match fs::remove_file(&p) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(format!("--overwrite: cannot remove {}: {e}", p.display())),
                    }
                }
            }
        }
        Ok(held)
    }

    /// The path of a file in the folder.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn entries(&self) -> Result<Vec<String>, String> {
        let rd = fs::read_dir(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let mut names = Vec::new();
        for e in rd {
            let e = e.map_err(|e| format!("{}: {e}", self.dir.display()))?;
            names.push(e.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        // Removed while still held (the file closes after this), so that a run waiting on
        // this file sees it replaced and retries; a lock file left behind by a crash is taken
        // over by the next run.
        let _ = fs::remove_file(&self.lock);
    }
}

/// Whether a folder entry is a temporary [`checkpoint::write_atomic`] makes for one of the
/// run's files (`.<name>.tmp-<pid>`); other files, even of that shape, are the user's.
fn is_temporary(name: &str) -> bool {
    [METRICS, LAST, BEST, PLAN].iter().any(|f| {
        name.strip_prefix('.')
            .and_then(|n| n.strip_prefix(f))
            .and_then(|n| n.strip_prefix(".tmp-"))
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
    })
}

fn note(text: &str) {
    crate::cli::write_err(&format!("note: {text}\n"));
}

/// Takes the folder's lock: `dir/train.lock`, held with `flock(2)` for as long as the
/// returned file is open, holding the holder's pid for messages. The kernel releases the lock
/// when its process ends however it ends, so a lock file a crashed or killed run left is
/// simply taken over (with a note naming the old pid); a held one is an error.
#[cfg(unix)]
fn take_lock(dir: &Path) -> Result<(PathBuf, File), String> {
    use std::io::{Read as _, Seek as _};
    use std::os::unix::fs::MetadataExt as _;
    use std::os::unix::io::AsRawFd as _;
    let path = dir.join(LOCK);
    let io = |e: std::io::Error| format!("lock file {}: {e}", path.display());
    // A holder removes the file before it releases the lock, so a lock won on a file that is
    // no longer the one at `path` is stale: open the new one and try again.
    for _ in 0..100 {
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // SAFETY: `f` owns a valid open descriptor for the duration of the call.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(e));
            }
            let mut text = String::new();
            let _ = f.read_to_string(&mut text);
            let who = match text.trim().parse::<u32>() {
                Ok(pid) => format!("pid {pid}, "),
                Err(_) => String::new(),
            };
            return Err(format!(
                "the output folder {} is in use by another `cvc train` ({who}lock file {}): wait for it to \
                 finish or choose another folder with --out",
                dir.display(),
                path.display()
            ));
        }
        let same = match (f.metadata(), fs::metadata(&path)) {
            (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
            _ => false,
        };
        if !same {
            continue;
        }
        let mut old = String::new();
        f.read_to_string(&mut old).map_err(io)?;
        if let Ok(pid) = old.trim().parse::<u32>() {
            note(&format!(
                "taking over the lock {} of process {pid}, which ended without releasing it",
                path.display()
            ));
        }
        f.set_len(0).map_err(io)?;
        f.rewind().map_err(io)?;
        f.write_all(format!("{}\n", std::process::id()).as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io)?;
        return Ok((path, f));
    }
    Err(format!("could not take the lock {}: it kept being replaced", path.display()))
}

/// Takes the folder's lock where `flock` does not exist: the file is created exclusively, and
/// one left by a crashed run must be deleted by hand (the error says so).
#[cfg(not(unix))]
fn take_lock(dir: &Path) -> Result<(PathBuf, File), String> {
    let path = dir.join(LOCK);
    match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(mut f) => {
            f.write_all(format!("{}\n", std::process::id()).as_bytes())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok((path, f))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(format!(
            "the output folder {} is in use by another `cvc train` (lock file {}): wait for it to finish or \
             choose another folder with --out; if no run uses it, delete the lock file",
            dir.display(),
            path.display()
        )),
        Err(e) => Err(format!("cannot create the lock file {}: {e}", path.display())),
    }
}

/// Where a resumed run continues from.
#[derive(Debug)]
pub struct ResumePoint {
    /// The checkpoint to load (the newer of the pair).
    pub checkpoint: Checkpoint,
    /// Its file.
    pub file: PathBuf,
    /// The epochs it finished.
    pub epoch: usize,
    /// The score of what `best.safetensors` holds now (later epochs must beat it), or `None`
    /// when there is no best checkpoint.
    pub best_score: Option<f64>,
    /// The epoch `best.safetensors` holds, when there is one.
    pub best_epoch: Option<usize>,
}

/// The epoch count in a checkpoint's metadata.
pub fn meta_epoch(ck: &Checkpoint, file: &Path) -> Result<usize, String> {
    ck.meta("epoch")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{}: metadata 'epoch' is missing or not a number", file.display()))
}

/// Picks the checkpoint `--resume` continues from, repairing an interrupted pair: when
/// `best` is newer than `last` (a crash between the two writes) or `last` is missing, the
/// run continues from `best` and `last` is rewritten from it.
pub fn resume_point(dir: &RunDir) -> Result<ResumePoint, String> {
    let last_path = dir.file(LAST);
    let best_path = dir.file(BEST);
    let read = |p: &Path| -> Result<Option<Checkpoint>, String> {
        if p.exists() {
            checkpoint::load(p).map(Some)
        } else {
            Ok(None)
        }
    };
    let last = read(&last_path)?;
    let best = read(&best_path)?;
    let last_epoch = last.as_ref().map(|c| meta_epoch(c, &last_path)).transpose()?;
    let best_epoch = best.as_ref().map(|c| meta_epoch(c, &best_path)).transpose()?;
    let best_score = match &best {
        Some(b) => Some(score_of(b, &best_path)?),
        None => None,
    };
    let from_best = match (last_epoch, best_epoch) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(l), Some(b)) => b > l,
    };
    if from_best {
        let (Some(ck), Some(epoch)) = (best, best_epoch) else {
            unreachable!("from_best implies a best file")
        };
        let was = last_epoch.map(|e| format!("holds epoch {e}")).unwrap_or_else(|| "is missing".into());
        note(&format!(
            "{} {was} but {} holds epoch {epoch}: the previous run stopped between writing the two; \
             continuing from {} and rewriting {} from it",
            last_path.display(),
            best_path.display(),
            BEST,
            LAST
        ));
        let bytes = fs::read(&best_path).map_err(|e| format!("{}: {e}", best_path.display()))?;
        checkpoint::write_atomic(&last_path, &bytes)?;
        return Ok(ResumePoint { checkpoint: ck, file: best_path, epoch, best_score, best_epoch });
    }
    let Some(ck) = last else {
        return Err(format!(
            "--resume: {} does not exist: start the run without --resume (with --overwrite if the folder \
             holds other files)",
            last_path.display()
        ));
    };
    let epoch = last_epoch.unwrap_or_default();
    match (best_epoch, ck.meta("best_epoch").and_then(|s| s.parse::<usize>().ok())) {
        (None, _) if epoch > 0 => note(&format!(
            "{} is missing: the next epoch's checkpoint becomes the best",
            best_path.display()
        )),
        (Some(have), Some(want)) if have != want => note(&format!(
            "{} holds epoch {have} but {} records the best at epoch {want} (a file replaced by hand, or a \
             run by an older cvc that wrote `last` first); later epochs are compared against the file's score",
            best_path.display(),
            last_path.display()
        )),
        _ => {}
    }
    Ok(ResumePoint { checkpoint: ck, file: last_path, epoch, best_score, best_epoch })
}

/// The score stored with a checkpoint (`score`, or for checkpoints without it, `best`).
fn score_of(ck: &Checkpoint, file: &Path) -> Result<f64, String> {
    ck.meta("score")
        .or_else(|| ck.meta("best"))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{}: metadata 'score' is missing or not a number", file.display()))
}

/// Cuts `metrics.jsonl` back to the records of epochs `1..=epochs` and, when the record of
/// epoch `epochs` is missing (a crash between the checkpoint and its line), appends
/// `record` (the line the checkpoint carries).
pub fn repair_metrics(path: &Path, epochs: usize, record: Option<&str>) -> Result<(), String> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let epoch_of = |l: &str| {
        serde_json::from_str::<serde_json::Value>(l)
            .ok()
            .and_then(|v| v.get("epoch").and_then(|e| e.as_u64()))
    };
    let mut kept: Vec<&str> =
        text.lines().filter(|l| epoch_of(l).is_some_and(|e| e as usize <= epochs)).collect();
    if epochs > 0 && !kept.iter().any(|l| epoch_of(l) == Some(epochs as u64)) {
        if let Some(r) = record {
            kept.push(r);
        }
    }
    let mut out = kept.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    if out == text {
        return Ok(());
    }
    checkpoint::write_atomic(path, out.as_bytes())
}

/// Test-only fault injection: aborts the process when `CVC_CRASH_AFTER` names `point`
/// (`POINT`, or `POINT:N` for its `N`th occurrence in this process). Abort, not exit: no
/// destructor runs, no buffer is flushed, the lock stays behind, as after a crash.
pub fn crash_point(point: &str) {
    static SEEN: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
    let Ok(spec) = std::env::var(CRASH_ENV) else { return };
    let (name, nth) = match spec.split_once(':') {
        Some((n, k)) => (n, k.parse::<usize>().unwrap_or(1)),
        None => (spec.as_str(), 1),
    };
    if name != point {
        return;
    }
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let count = seen.entry(point.to_string()).or_insert(0);
    *count += 1;
    if *count == nth {
        std::process::abort();
    }
}
