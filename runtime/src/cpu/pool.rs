//! A persistent pool of worker threads that run one borrowed closure at a time.
//!
//! `std::thread::scope` would spawn (and allocate) on every call; a step must not allocate,
//! so the workers are started once at load and handed a pointer to the job. `Mutex` and
//! `Condvar` are futex-based and do not allocate.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = *const (dyn Fn(usize) + Sync);

struct State {
    job: Option<Job>,
    generation: u64,
    finished: usize,
    /// Whether a worker's part of the current job panicked.
    panicked: bool,
    quit: bool,
}

// SAFETY: the job pointer is only dereferenced while `run` keeps the closure borrowed.
unsafe impl Send for State {}

struct Shared {
    state: Mutex<State>,
    start: Condvar,
    done: Condvar,
}

/// A fixed set of worker threads; the calling thread is worker 0.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool running jobs on `threads` threads in total (the caller plus `threads - 1`).
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { job: None, generation: 0, finished: 0, panicked: false, quit: false }),
            start: Condvar::new(),
            done: Condvar::new(),
        });
        let workers = (1..threads.max(1))
            .map(|id| {
                let sh = Arc::clone(&shared);
                std::thread::spawn(move || worker(&sh, id))
            })
            .collect();
        Pool { shared, workers }
    }

    /// Number of threads a job runs on.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every thread index `i` in `0..threads()`, returning when all are done.
    ///
    /// # Panics
    /// When `f` panics on any thread (after every thread has finished its part).
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        // SAFETY: the pointer's lifetime is erased, but we wait below until every worker has
        // finished with it before returning (and so before `f` can be dropped).
        let job: Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f) };
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.job = Some(job);
            st.finished = 0;
            st.generation += 1;
        }
        self.shared.start.notify_all();
        // Our own part must not unwind past the wait below: the workers still hold `f`.
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(0)));
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        while st.finished < self.workers.len() {
            st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.job = None;
        let theirs = std::mem::take(&mut st.panicked);
        drop(st);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if theirs {
            panic!("a CPU kernel panicked on a worker thread");
        }
    }
}

fn worker(sh: &Shared, id: usize) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
            while st.generation == seen && !st.quit {
                st = sh.start.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.quit {
                return;
            }
            seen = st.generation;
            st.job
        };
        let mut ok = true;
        if let Some(job) = job {
            // SAFETY: `Pool::run` keeps the closure alive until `finished` counts us.
            let part = std::panic::AssertUnwindSafe(|| unsafe { (*job)(id) });
            ok = std::panic::catch_unwind(part).is_ok();
        }
        let mut st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
        st.panicked |= !ok;
        st.finished += 1;
        sh.done.notify_all();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.quit = true;
        }
        self.shared.start.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
