//! The lifetime layer without a driver: the protocol, hostile files and directories, liveness
//! across process death and fork, and random damage to a live file. Every child process runs
//! under a deadline and is killed past it: a hang is a failure, never a stuck test run.

use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

/// A private stand-in for `/dev/shm` (removed when dropped), so that tests that damage the
/// per-user directory never disturb one another or the machine's real one.
struct Root(PathBuf);

impl Root {
    fn new() -> Root {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = PathBuf::from(format!(
            "{SHM_DIR}/tb-lifetime-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        // As `/dev/shm` is: anyone may create, only owners may remove.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).unwrap();
        Root(p)
    }

    fn dir(&self) -> PathBuf {
        dir_path(&self.0, uid())
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn is_root() -> bool {
    uid() == 0
}

/// A producer's file and a consumer's open of it (the same process plays both, through two
/// open file descriptions: the protocol lives in the file and its locks).
fn pair(root: &Root) -> (Arc<SlotFile>, Arc<SlotFile>) {
    let p = SlotFile::create_in(&root.0).expect("a lifetime file");
    let c = SlotFile::open_in(&root.0, p.producer, uid(), p.nonce)
        .unwrap()
        .expect("the file just made");
    (Arc::new(p), Arc::new(c))
}

fn is_refused(r: &Result<Option<SlotFile>, Error>, what: &str) -> bool {
    matches!(r, Err(Error::IpcLifetimeFileRefused { found, .. }) if found.contains(what))
}

/// Runs `f` on a thread and fails if it takes longer than `limit` (a blocking open would).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .expect("finished in time (an open blocked, or something hung)")
}

/// Waits for `child` to exit, killing it past `limit`; its exit code.
fn wait_for(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {} hung", child.id());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Forks; the child runs `f` (which must only do simple work) and exits with its code. The
/// parent waits at most `limit` (killing the child past it) and returns the code, or the
/// signal that ended the child as a negative number. What `f` captured is the child's: the
/// parent forgets it, never drops it.
fn in_fork(limit: Duration, f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only runs `f` and `_exit`s; it never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: ends the child at once, running no destructor of the parent's state.
        unsafe { libc::_exit(code) };
    }
    std::mem::forget(f);
    let deadline = Instant::now() + limit;
    let mut status = 0;
    loop {
        // SAFETY: `pid` is our child; `status` is a live local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: `pid` is our child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            panic!("forked child hung");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -libc::WTERMSIG(status)
    }
}

// ---- the protocol ----

#[test]
fn own_identity_is_read_again_after_fork() {
    let parent = me();
    assert_eq!(parent.pid, std::process::id());
    if std::path::Path::new("/proc/self/stat").exists() {
        assert_ne!(parent.start, 0, "/proc gives a start time");
    }
    let code = in_fork(Duration::from_secs(10), move || {
        let child = me();
        i32::from(child.pid != std::process::id() || child.pid == parent.pid)
    });
    assert_eq!(code, 0, "the child's identity is its own");
}

#[test]
fn the_directory_and_file_are_private_and_checked_on_open() {
    let root = Root::new();
    let (p, _c) = pair(&root);
    let dir_mode = std::fs::metadata(root.dir()).unwrap().permissions().mode();
    assert_eq!(dir_mode & 0o7777, 0o700);
    let mode = std::fs::metadata(&p.path).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o600);
    assert_eq!(std::fs::metadata(&p.path).unwrap().len(), FILE_BYTES as u64);
    // Another producer identity: not this file.
    let other = ProcessId {
        pid: p.producer.pid,
        start: p.producer.start + 1,
    };
    assert!(is_refused(
        &SlotFile::open_in(&root.0, other, uid(), p.nonce),
        "header"
    ));
    // Another nonce: no such file.
    assert!(
        SlotFile::open_in(&root.0, p.producer, uid(), p.nonce ^ 1)
            .unwrap()
            .is_none()
    );
    // Another user's handle: refused before anything is opened.
    assert!(matches!(
        SlotFile::open_in(&root.0, p.producer, uid() ^ 1, p.nonce),
        Err(Error::IpcOtherUser { .. })
    ));
    assert!(
        _c.producer_alive(),
        "seen from another open file description"
    );
}

#[test]
fn a_restrictive_umask_still_gives_exact_modes() {
    let root = Root::new();
    let shm = root.0.clone();
    let dir = root.dir();
    let code = in_fork(Duration::from_secs(10), move || {
        // SAFETY: sets this (forked, single-threaded) child's umask.
        unsafe { libc::umask(0o277) };
        let Ok(f) = SlotFile::create_in(&shm) else {
            return 1;
        };
        let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode() & 0o7777);
        i32::from(mode(&dir) != 0o700) * 2 + i32::from(mode(&f.path) != 0o600) * 4
    });
    assert_eq!(code, 0, "1: refused, 2: directory mode, 4: file mode");
}

#[test]
fn tickets_open_and_holders_decide_release() {
    let root = Root::new();
    let (p, c) = pair(&root);
    let mut dead = Vec::new();
    p.assign(5, 9, 1).unwrap();
    // Wrong generation: refused before any entry is claimed.
    assert!(matches!(
        c.register(5, 8, &mut dead),
        Err(Refusal::Released)
    ));
    assert!(p.holders(5).is_empty());
    // The expected consumer takes the ticket.
    let r = c.register(5, 9, &mut dead).unwrap();
    assert_eq!(p.tickets(5), 0);
    assert_eq!(p.holders(5), [std::process::id()]);
    // While open, more consumers may hold it without a ticket.
    let r2 = c.register(5, 9, &mut dead).unwrap();
    p.close(5, 9);
    // Closed, no tickets: no one else, and the refused claim gave its entry back.
    assert!(matches!(
        c.register(5, 9, &mut dead),
        Err(Refusal::Released)
    ));
    assert_eq!(p.holders(5).len(), 2);
    assert!(!p.is_released(5, 9, &mut dead), "held by live processes");
    drop(r);
    assert!(!p.is_released(5, 9, &mut dead));
    drop(r2);
    assert!(p.is_released(5, 9, &mut dead));
    assert!(dead.is_empty());
    // Released: the slot no longer names the share.
    assert!(matches!(
        c.register(5, 9, &mut dead),
        Err(Refusal::Released)
    ));
}

#[test]
fn a_ticket_outlives_the_producer_handle_and_a_cancelled_open_returns_it() {
    let root = Root::new();
    let (p, c) = pair(&root);
    let mut dead = Vec::new();
    p.assign(0, 1, 2).unwrap();
    p.close(0, 1);
    assert!(!p.is_released(0, 1, &mut dead), "two tickets left");
    // An open that fails after registering gives its ticket back.
    let failed = c.register(0, 1, &mut dead).unwrap();
    assert_eq!(p.tickets(0), 1);
    failed.cancel();
    failed.cancel(); // once only
    drop(failed);
    assert_eq!(p.tickets(0), 2, "the failed open's ticket came back");
    let r = c.register(0, 1, &mut dead).unwrap();
    assert_eq!(
        c.take_ticket(0, 1).ok(),
        Some(true),
        "the producer's own process"
    );
    assert_eq!(p.tickets(0), 0);
    assert!(matches!(c.take_ticket(0, 1), Err(Refusal::Released)));
    assert!(!p.is_released(0, 1, &mut dead));
    drop(r);
    assert!(p.is_released(0, 1, &mut dead));
}

#[test]
fn a_full_slot_takes_back_entries_whose_lock_is_free() {
    let root = Root::new();
    let (p, c) = pair(&root);
    let mut dead = Vec::new();
    p.assign(2, 1, 0).unwrap();
    let held: Vec<_> = (0..HOLDERS)
        .map(|_| c.register(2, 1, &mut dead).unwrap())
        .collect();
    assert!(matches!(c.register(2, 1, &mut dead), Err(Refusal::Full)));
    // Entries that name a process but whose lock nobody holds (a holder that died): written
    // by hand, as a dead process leaves them.
    drop(held);
    for i in 0..HOLDERS {
        p.write(p.holder_at(2, i), &4_000_000u32.to_le_bytes())
            .unwrap();
    }
    let r = c.register(2, 1, &mut dead).unwrap();
    assert_eq!(
        dead.len(),
        HOLDERS,
        "every dead entry taken back and reported"
    );
    assert_eq!(p.holders(2), [std::process::id()]);
    drop(r);
}

// ---- hostile files and directories ----

/// Plants `make(path)` where the file of `(pid 1, nonce)` would be, and opens it.
fn open_planted(make: impl FnOnce(&Path)) -> Result<Option<SlotFile>, Error> {
    let root = Root::new();
    drop(SlotFile::create_in(&root.0).unwrap()); // makes the directory
    let producer = ProcessId { pid: 1, start: 0 };
    let path = root.dir().join(file_name(1, 7));
    make(&path);
    let shm = root.0.clone();
    let r = within(Duration::from_secs(10), move || {
        SlotFile::open_in(&shm, producer, uid(), 7)
    });
    drop(root);
    r
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path, live for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, bytes))
        .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A well-formed header for producer `(1, 0)` and nonce 7, padded to the file's size.
fn good_file() -> Vec<u8> {
    let mut b = vec![0u8; FILE_BYTES];
    b[..8].copy_from_slice(&FILE_MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&FILE_VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&SLOTS.to_le_bytes());
    b[16..20].copy_from_slice(&1u32.to_le_bytes());
    b[20..24].copy_from_slice(&uid().to_le_bytes());
    b[32..40].copy_from_slice(&7u64.to_le_bytes());
    b
}

#[test]
fn a_planted_well_formed_file_opens() {
    // The control for the refusals below: the same bytes, as the producer writes them.
    let r = open_planted(|p| write_file(p, &good_file(), 0o600));
    let f = r.unwrap().expect("a well-formed file opens");
    assert!(!f.producer_alive(), "nobody holds its liveness lock");
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    assert!(is_refused(&open_planted(mkfifo), "FIFO"));
}

#[test]
fn a_symlink_to_a_good_file_is_refused() {
    let r = open_planted(|p| {
        let target = p.with_file_name("target");
        write_file(&target, &good_file(), 0o600);
        std::os::unix::fs::symlink(&target, p).unwrap();
    });
    assert!(is_refused(&r, "symbolic link"));
}

#[test]
fn a_directory_is_refused() {
    assert!(is_refused(
        &open_planted(|p| std::fs::create_dir(p).unwrap()),
        "directory"
    ));
}

#[test]
fn a_file_of_another_mode_is_refused() {
    let r = open_planted(|p| write_file(p, &good_file(), 0o644));
    assert!(is_refused(&r, "mode 0644"));
}

#[test]
fn a_shrunk_or_grown_file_is_refused() {
    let r = open_planted(|p| write_file(p, &good_file()[..100], 0o600));
    assert!(is_refused(&r, "100 bytes"));
    let mut big = good_file();
    big.push(0);
    let r = open_planted(|p| write_file(p, &big, 0o600));
    assert!(is_refused(&r, "262209 bytes"));
}

#[test]
fn a_garbage_header_is_refused() {
    let mut b = good_file();
    b[3] ^= 0xff;
    assert!(is_refused(
        &open_planted(|p| write_file(p, &b, 0o600)),
        "header"
    ));
}

#[test]
fn another_owners_file_is_refused() {
    if !is_root() {
        eprintln!("skipped: making a file of another owner needs root");
        return;
    }
    let r = open_planted(|p| {
        write_file(p, &good_file(), 0o600);
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    });
    assert!(is_refused(&r, "owned by user 65534"));
}

#[test]
fn a_bad_user_directory_is_refused_and_never_followed() {
    // A symbolic link to a directory that would pass every other check.
    let root = Root::new();
    let elsewhere = root.0.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.dir()).unwrap();
    assert!(matches!(
        SlotFile::create_in(&root.0),
        Err(Error::IpcLifetimeFileRefused { ref found, .. }) if found == "a symbolic link"
    ));
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing made there"
    );
    // A directory of another mode.
    let root = Root::new();
    std::fs::create_dir(root.dir()).unwrap();
    std::fs::set_permissions(root.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(matches!(
        SlotFile::create_in(&root.0),
        Err(Error::IpcLifetimeFileRefused { ref found, .. }) if found == "mode 0755"
    ));
    // Not a directory.
    let root = Root::new();
    write_file(&root.dir(), b"x", 0o600);
    assert!(matches!(
        SlotFile::create_in(&root.0),
        Err(Error::IpcLifetimeFileRefused { .. })
    ));
    // Another user's directory.
    if is_root() {
        let root = Root::new();
        std::fs::create_dir(root.dir()).unwrap();
        std::fs::set_permissions(root.dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(root.dir(), Some(65534), None).unwrap();
        assert!(matches!(
            SlotFile::create_in(&root.0),
            Err(Error::IpcLifetimeFileRefused { ref found, .. }) if found == "owned by user 65534"
        ));
    }
}

#[test]
fn another_user_can_neither_use_nor_preempt_a_users_files() {
    if !is_root() {
        eprintln!("skipped: switching users needs root");
        return;
    }
    let root = Root::new();
    let p = SlotFile::create_in(&root.0).unwrap();
    p.assign(0, 1, 1).unwrap();
    // The other user's own directory, planted by root before that user's first share.
    let theirs = dir_path(&root.0, 65534);
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let shm = root.0.clone();
    let (producer, nonce, my_uid) = (p.producer, p.nonce, uid());
    let code = in_fork(Duration::from_secs(10), move || {
        // SAFETY: plain system calls of the child.
        if unsafe { libc::setgid(65534) } != 0 || unsafe { libc::setuid(65534) } != 0 {
            return 10;
        }
        // Root's handle: refused as another user's, nothing opened.
        if !matches!(
            SlotFile::open_in(&shm, producer, my_uid, nonce),
            Err(Error::IpcOtherUser { .. })
        ) {
            return 11;
        }
        // Root's file, named directly: the directory is closed to this user.
        if std::fs::File::open(dir_path(&shm, my_uid).join(file_name(producer.pid, nonce))).is_ok()
        {
            return 12;
        }
        // Its own directory, made by someone else: refused, not used.
        if !matches!(
            SlotFile::create_in(&shm),
            Err(Error::IpcLifetimeFileRefused { ref found, .. }) if found == "owned by user 0"
        ) {
            return 13;
        }
        0
    });
    assert_eq!(code, 0, "check {code} of the other user's child failed");
    assert_eq!(p.tickets(0), 1, "nothing changed");
}

#[test]
fn the_stale_scan_skips_fifos_links_and_live_files_without_blocking() {
    let root = Root::new();
    let live = SlotFile::create_in(&root.0).unwrap();
    let dir = root.dir();
    mkfifo(&dir.join(file_name(2, 1)));
    let target = root.0.join("victim");
    write_file(&target, &good_file(), 0o600);
    std::os::unix::fs::symlink(&target, dir.join(file_name(3, 1))).unwrap();
    // A dead producer's file: well formed, nobody holds its lock.
    write_file(&dir.join(file_name(1, 7)), &good_file(), 0o600);
    let shm = root.0.clone();
    let next = within(Duration::from_secs(10), move || SlotFile::create_in(&shm)).unwrap();
    assert!(
        !dir.join(file_name(1, 7)).exists(),
        "the dead producer's file is removed"
    );
    assert!(live.path.exists() && next.path.exists(), "live files stay");
    assert!(dir.join(file_name(2, 1)).exists(), "the FIFO is left alone");
    assert!(target.exists(), "the link is not followed");
    // The producer removes its own file.
    live.remove();
    assert!(!live.path.exists());
}

// ---- damage under a live share ----

#[test]
fn a_file_shrunk_under_a_live_share_gives_errors_not_signals() {
    let root = Root::new();
    let (p, c) = pair(&root);
    assert!(p.intact());
    let mut dead = Vec::new();
    p.assign(3, 4, 2).unwrap();
    let r = c.register(3, 4, &mut dead).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p.path)
        .unwrap()
        .set_len(10)
        .unwrap();
    assert!(
        !p.intact(),
        "the producer sees it (and puts no new share there)"
    );
    // A consumer: a typed error.
    assert!(matches!(
        c.register(3, 4, &mut dead),
        Err(Refusal::File(Error::IpcLifetimeFileRefused { .. }))
    ));
    assert!(matches!(c.take_ticket(3, 4), Err(Refusal::File(_))));
    assert_eq!(p.tickets(3), 0);
    // The producer: the live holder's lock still counts; its release frees the share.
    p.close(3, 4);
    assert!(!p.is_released(3, 4, &mut dead), "a live holder");
    drop(r);
    assert!(p.is_released(3, 4, &mut dead));
    // A new open of the shrunk file is refused.
    assert!(is_refused(
        &SlotFile::open_in(&root.0, p.producer, uid(), p.nonce),
        "bytes long"
    ));
}

// ---- liveness across processes ----

/// The child half of the tests below; does nothing in a normal run. `TB_LIFETIME_CHILD` is
/// `hold:<root>:<pid>:<start>:<nonce>:<slot>:<generation>` (hold a share) or `produce:<root>`
/// (make a file); it prints `ready ...` and sleeps until killed.
#[test]
fn child_process() {
    let Ok(spec) = std::env::var("TB_LIFETIME_CHILD") else {
        return;
    };
    let v: Vec<&str> = spec.split(':').collect();
    let root = PathBuf::from(v[1]);
    if v[0] == "hold" {
        let n = |i: usize| v[i].parse::<u64>().unwrap();
        let producer = ProcessId {
            pid: n(2) as u32,
            start: n(3),
        };
        let file = Arc::new(
            SlotFile::open_in(&root, producer, uid(), n(4))
                .unwrap()
                .unwrap(),
        );
        let held = file.register(n(5) as u32, n(6), &mut Vec::new()).unwrap();
        println!("ready");
        std::thread::sleep(Duration::from_secs(60));
        drop(held);
    } else {
        let f = SlotFile::create_in(&root).unwrap();
        f.assign(0, 1, 1).unwrap();
        println!("ready {}:{}:{}", f.producer.pid, f.producer.start, f.nonce);
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// Starts `child_process` with `spec`; returns it and what it printed after `ready`.
fn spawn_child(spec: String) -> (Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ipc::lifetime::tests::child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TB_LIFETIME_CHILD", spec)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = within(Duration::from_secs(30), move || {
        use std::io::BufRead as _;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| {
                l.find("ready")
                    .map(|i| l[i + "ready".len()..].trim().to_string())
            })
    });
    let Some(line) = line else {
        let _ = child.kill();
        panic!("the child never got ready");
    };
    (child, line)
}

fn kill9(child: &mut Child) {
    child.kill().unwrap(); // SIGKILL: no destructor runs
    let _ = wait_for(child, Duration::from_secs(10));
}

#[test]
fn a_consumer_killed_while_holding_is_taken_back() {
    let root = Root::new();
    let p = SlotFile::create_in(&root.0).unwrap();
    p.assign(3, 11, 1).unwrap();
    p.close(3, 11);
    let (mut child, _) = spawn_child(format!(
        "hold:{}:{}:{}:{}:3:11",
        root.0.display(),
        p.producer.pid,
        p.producer.start,
        p.nonce
    ));
    let mut dead = Vec::new();
    assert_eq!(p.holders(3), [child.id()], "the child holds the share");
    assert_eq!(p.tickets(3), 0, "and took the ticket");
    assert!(!p.is_released(3, 11, &mut dead), "a live holder");
    kill9(&mut child);
    assert!(
        p.is_released(3, 11, &mut dead),
        "the dead holder's lock is gone"
    );
    assert_eq!(dead, [child.id()], "and reported");
}

#[test]
fn a_killed_producer_is_gone_and_its_file_is_removed_by_the_next() {
    let root = Root::new();
    let (mut child, said) = spawn_child(format!("produce:{}", root.0.display()));
    let v: Vec<u64> = said.split(':').map(|x| x.parse().unwrap()).collect();
    let producer = ProcessId {
        pid: v[0] as u32,
        start: v[1],
    };
    let f = Arc::new(
        SlotFile::open_in(&root.0, producer, uid(), v[2])
            .unwrap()
            .unwrap(),
    );
    assert!(f.producer_alive());
    let r = f.register(0, 1, &mut Vec::new()).unwrap();
    kill9(&mut child);
    assert!(
        !f.producer_alive(),
        "the kernel dropped the producer's lock"
    );
    drop(r);
    let path = f.path.clone();
    assert!(path.exists());
    let next = SlotFile::create_in(&root.0).unwrap();
    assert!(
        !path.exists(),
        "the next producer removed the dead one's file"
    );
    next.remove();
}

#[test]
fn a_forked_child_dropping_inherited_holds_changes_nothing() {
    let root = Root::new();
    let (p, c) = pair(&root);
    let mut dead = Vec::new();
    p.assign(6, 2, 0).unwrap();
    let r = c.register(6, 2, &mut dead).unwrap();
    p.close(6, 2);
    let inherited = &r as *const Registration as usize;
    let (c2, p2) = (c.clone(), p.clone());
    let code = in_fork(Duration::from_secs(10), move || {
        // Everything the child inherited goes: its copy of the hold, of the consumer's file
        // and of the producer's.
        // SAFETY: the child's memory is a copy of the parent's: `inherited` points at the
        // child's own copy of `r`, read once here and never used again in the child.
        drop(unsafe { std::ptr::read(inherited as *const Registration) });
        drop(c2);
        drop(p2);
        0
    });
    assert_eq!(code, 0);
    assert_eq!(
        p.holders(6),
        [std::process::id()],
        "the parent's hold stands"
    );
    assert!(!p.is_released(6, 2, &mut dead));
    assert!(c.producer_alive());
    drop(r);
    assert!(
        p.is_released(6, 2, &mut dead),
        "the parent's own release still works"
    );
}

// ---- random damage ----

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any bytes written anywhere into a live file, and any size it is cut or grown to:
    /// every operation of either side returns (a value or a typed error), and a holder's
    /// lock still decides release.
    #[test]
    fn damage_to_a_live_file_never_panics_or_signals(
        edits in prop::collection::vec((0usize..FILE_BYTES + 64, prop::collection::vec(any::<u8>(), 1..16)), 0..8),
        size in prop_oneof![Just(FILE_BYTES), 0usize..FILE_BYTES * 2],
    ) {
        let root = Root::new();
        let (p, c) = pair(&root);
        let mut dead = Vec::new();
        p.assign(0, 1, 1).unwrap();
        p.assign(1, 2, 0).unwrap();
        let r = c.register(1, 2, &mut dead).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&p.path).unwrap();
        // Anywhere but slot 1's word, whose tickets would rightly keep the share.
        let word = (HEADER + SLOT_BYTES) as u64..(HEADER + SLOT_BYTES + 8) as u64;
        for (at, bytes) in &edits {
            let at = *at as u64;
            if at < word.end && at + bytes.len() as u64 > word.start {
                continue;
            }
            f.write_all_at(bytes, at).unwrap();
        }
        f.set_len(size as u64).unwrap();
        let _ = c.register(0, 1, &mut dead);
        let _ = c.take_ticket(0, 1);
        let _ = p.tickets(0);
        let _ = p.holders(1);
        let _ = SlotFile::open_in(&root.0, p.producer, uid(), p.nonce);
        p.close(1, 2);
        prop_assert!(!p.is_released(1, 2, &mut dead), "a live holder's lock counts");
        drop(r);
        prop_assert!(p.is_released(1, 2, &mut dead));
    }
}
