//! A `Tensor` moved to a Python process through NIXL: the Rust agent WRITEs a strided
//! (transposed) tensor, run by run, into a NumPy buffer the Python agent registered
//! (`tests/peer.py`), with a notification; Python prints what it received.
//!
//! Needs NIXL: `libnixl_capi.so` on `LD_LIBRARY_PATH` (the folder in NIXL's Python wheel),
//! `TB_NIXL_PYTHON` (an interpreter with NumPy) and `TB_NIXL_PYTHONPATH` (where NIXL is
//! installed for it); `cargo xtask ci` sets all three and `TB_REQUIRE_NIXL=1`. Without them
//! the test says so on stderr and passes, unless `TB_REQUIRE_NIXL=1`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_sys::{MemType, OptArgs, XferDescList, XferOp};
use tensorbridge_core::{DType, Owner, RawTensor, Tensor};
use tensorbridge_nixl::{NixlTensor, agent, nixl_available, register, xfer_desc_list};

const ROWS: i64 = 16;
const COLS: i64 = 32;

fn skip_or_fail(why: &str) -> bool {
    if std::env::var("TB_REQUIRE_NIXL").as_deref() == Ok("1") {
        panic!("TB_REQUIRE_NIXL=1, but {why}");
    }
    eprintln!("skipped: {why}");
    true
}

/// The number after `"key":` in a one-line JSON object.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let start = line.find(&format!("\"{key}\":")).expect(key) + key.len() + 3;
    let rest = line[start..].trim_start();
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let end = rest.find(['"', ',', '}']).expect("end of field");
    &rest[..end]
}

#[test]
fn tensor_moves_to_a_python_process() {
    if !nixl_available() && skip_or_fail("libnixl_capi.so is not on LD_LIBRARY_PATH") {
        return;
    }
    let Ok(python) = std::env::var("TB_NIXL_PYTHON") else {
        skip_or_fail("TB_NIXL_PYTHON is not set");
        return;
    };
    let n = (ROWS * COLS) as usize;
    let mut child = Command::new(python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peer.py"))
        .arg(n.to_string())
        .env(
            "PYTHONPATH",
            std::env::var("TB_NIXL_PYTHONPATH").unwrap_or_default(),
        )
        .env("UCX_NET_DEVICES", "lo")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python peer");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut next_json = || {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "peer exited early");
            if line.starts_with('{') {
                return line.clone();
            }
        }
    };
    let hello = next_json();
    let md: Vec<u8> = (0..field(&hello, "md").len() / 2)
        .map(|i| u8::from_str_radix(&field(&hello, "md")[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let remote_addr: usize = field(&hello, "addr").parse().unwrap();

    // The tensor: a (COLS, ROWS) transpose of a row-major (ROWS, COLS) buffer of 0, 1, ...:
    // its runs are single elements, in the transpose's element order.
    let buf = Arc::new((0..n).map(|x| x as f32 * 0.5).collect::<Vec<f32>>());
    let shape = [COLS, ROWS];
    let strides = [1, COLS];
    let raw = RawTensor {
        strides: Some(&strides),
        ..RawTensor::host(buf.as_ptr() as usize, DType::FLOAT32, &shape)
    };
    let owner: Owner = buf.clone();
    // SAFETY: the transpose's span is exactly `buf`'s elements, kept alive by the owner; no
    // one writes `buf` while NIXL reads it.
    let tensor = unsafe { Tensor::from_descriptor(raw.validate().unwrap(), owner) };
    let expected: Vec<f32> = (0..COLS)
        .flat_map(|c| (0..ROWS).map(move |r| (r * COLS + c) as f32 * 0.5))
        .collect();

    let agent = agent("rs-initiator").expect("agent");
    let (_mems, params) = agent.get_plugin_params("UCX").expect("UCX plugin");
    agent.create_backend("UCX", &params).expect("UCX backend");
    let region = NixlTensor::new_read_only(tensor).unwrap();
    let registered = register(&agent, region.clone()).expect("register");
    let peer = agent.load_remote_md(&md).expect("remote metadata");
    let my_md = agent.get_local_md().unwrap();
    let hex: String = my_md.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(child.stdin.as_mut().unwrap(), "{hex}").unwrap();

    let local = xfer_desc_list(std::slice::from_ref(&region), 1 << 16).unwrap();
    let mut remote = XferDescList::new(MemType::Dram).unwrap();
    for i in 0..n {
        remote.add_desc(remote_addr + 4 * i, 4, 0);
    }
    let mut args = OptArgs::new().unwrap();
    args.set_notification_message(b"rs-done").unwrap();
    args.set_has_notification(true).unwrap();
    let req = agent
        .create_xfer_req(XferOp::Write, &local, &remote, &peer, Some(&args))
        .expect("transfer request");
    agent.post_xfer_req(&req, Some(&args)).expect("post");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !agent.get_xfer_status(&req).unwrap().is_success() {
        assert!(Instant::now() < deadline, "transfer not done in 60 s");
        std::thread::yield_now();
    }
    let done = next_json();
    let got: Vec<f32> = field_list(&done);
    assert_eq!(got, expected);
    assert!(child.wait().unwrap().success());
    let back = registered.deregister().unwrap();
    assert_eq!(back.data_ptr(), buf.as_ptr() as usize);
}

fn field_list(line: &str) -> Vec<f32> {
    let start = line.find('[').unwrap() + 1;
    let end = line.rfind(']').unwrap();
    line[start..end]
        .split(',')
        .map(|x| x.trim().parse().unwrap())
        .collect()
}
