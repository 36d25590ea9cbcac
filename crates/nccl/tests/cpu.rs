//! Tests that run on any machine: the probe without a library, the real
//! unique id through a store (with the pip NCCL library the test script
//! installs), communicator creation without a GPU, the file store.
//!
//! A test that needs the NCCL library prints why it skipped when it is
//! absent; with `CCOL_STRICT_SKIPS=1` (the test script, which installs it)
//! that is a failure.

use compiler_collectives_conformance::process::OutputWithin;
use compiler_collectives_conformance::skip::{skip_test, Missing};
use compiler_collectives_core::{Deadline, Error, InProcessStore, Store};
use compiler_collectives_nccl::{
    device_count, fetch_unique_id, find_library, publish_unique_id, Communicator, FileStore,
    NcclError, NcclOptions, NcclSearch, NcclTransport, UniqueId, UNHANDLED_CUDA_ERROR,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The library of the default search, or `None` after the skip rule
/// (scripts/setup-nccl.sh installs it, so a failure under strict skips).
fn lib_or_skip(test: &str) -> Option<Arc<compiler_collectives_nccl::NcclLib>> {
    match compiler_collectives_nccl::library() {
        Ok(lib) => Some(lib),
        Err(e) => {
            skip_test(
                test,
                Missing::install(format!("NCCL (run scripts/setup-nccl.sh): {e}")),
            );
            None
        }
    }
}

/// The library for a test of what happens without a GPU: `None` after the
/// skip rule, or (printing why, with `note`) on a machine with GPUs.
fn lib_without_a_gpu(test: &str, note: &str) -> Option<Arc<compiler_collectives_nccl::NcclLib>> {
    let lib = lib_or_skip(test)?;
    if let Ok(n) = device_count() {
        println!("skipped: this machine has {n} GPU(s){note}");
        return None;
    }
    Some(lib)
}

/// Runs this test binary again as the child of `test` (only that test, its
/// output shown), with the variable `child` set to 1 and what `env` adds to
/// its environment; its output.
fn run_as_child(
    test: &str,
    child: &str,
    env: impl FnOnce(&mut std::process::Command) -> &mut std::process::Command,
) -> std::process::Output {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", test, "--nocapture"]).env(child, "1");
    env(&mut c)
        .output_within(std::time::Duration::from_secs(120))
        .unwrap()
}

/// Asserts that the child's run succeeded and printed `ok`.
fn assert_child_ok(out: &std::process::Output, ok: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(ok),
        "child: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The library's error behind a core error.
fn nccl_error(e: &Error) -> Option<&NcclError> {
    match e {
        Error::Backend {
            engine: Some(s), ..
        } => s.downcast_ref::<NcclError>(),
        _ => None,
    }
}

#[test]
fn probe_without_library_says_not_found_and_what_to_do() {
    let empty = tempfile::tempdir().unwrap();
    let search = NcclSearch {
        explicit: None,
        linker_names: vec!["libccol-no-such-nccl.so.2".into()],
        dirs: vec![empty.path().to_path_buf()],
        python: None,
    };
    let err = find_library(&search).unwrap_err();
    let NcclError::LibraryNotFound { tried } = &err else {
        panic!("expected LibraryNotFound, got {err:?}");
    };
    assert_eq!(tried.len(), 2, "{tried:?}");
    assert!(tried[0].starts_with("libccol-no-such-nccl.so.2 (dynamic linker)"));
    assert!(tried[1].contains("(absent)"));
    let text = err.to_string();
    for needle in ["pip install nvidia-nccl-cu13==2.29.7", "CCOL_NCCL_LIB"] {
        assert!(text.contains(needle), "{text}");
    }
}

#[test]
fn explicit_path_that_is_missing_is_an_error_not_a_fallback() {
    let search = NcclSearch {
        explicit: Some("/nonexistent/ccol/libnccl.so.2".into()),
        linker_names: vec!["libnccl.so.2".into()],
        ..NcclSearch::default()
    };
    let err = find_library(&search).unwrap_err();
    assert!(
        matches!(&err, NcclError::LibraryNotFound { tried } if tried.len() == 1 && tried[0].contains("CCOL_NCCL_LIB=/nonexistent/ccol/libnccl.so.2")),
        "{err:?}"
    );
}

#[test]
fn a_file_that_is_not_a_library_gives_a_load_error() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libnccl.so.2");
    std::fs::write(&fake, b"not an ELF file").unwrap();
    // Named explicitly: the error is returned.
    let err = find_library(&NcclSearch {
        explicit: Some(dir.path().to_path_buf()),
        ..NcclSearch::default()
    })
    .unwrap_err();
    assert!(
        matches!(&err, NcclError::LibraryLoad { path, .. } if path.ends_with("libnccl.so.2")),
        "{err:?}"
    );
    // Found by the search: skipped and listed.
    let err = find_library(&NcclSearch {
        dirs: vec![dir.path().to_path_buf()],
        ..NcclSearch::default()
    })
    .unwrap_err();
    let NcclError::LibraryNotFound { tried } = &err else {
        panic!("{err:?}");
    };
    assert!(tried[0].contains("cannot load NCCL"), "{tried:?}");
}

#[test]
fn driver_probe_never_panics() {
    match device_count() {
        Ok(n) => assert!(n > 0),
        Err(NcclError::DriverNotFound) => {
            let text = NcclError::DriverNotFound.to_string();
            assert!(text.contains("libcuda.so.1") && text.contains("NVIDIA driver"));
        }
        Err(NcclError::NoDevice { detail }) => assert!(!detail.is_empty()),
        Err(other) => panic!("unexpected probe error {other:?}"),
    }
}

#[test]
fn unique_id_round_trip_through_a_store() {
    let Some(lib) = lib_or_skip("unique_id_round_trip_through_a_store") else {
        return;
    };
    assert!(lib.version() >= 22800, "{}", lib.version_string());
    println!(
        "NCCL {} from {}",
        lib.version_string(),
        lib.path().display()
    );
    let store = Arc::new(InProcessStore::new());
    let deadline = Deadline::after(Duration::from_secs(10));
    // The other ranks wait before rank 0 has published.
    let readers: Vec<_> = (1..4)
        .map(|_| {
            let s = Arc::clone(&store);
            std::thread::spawn(move || fetch_unique_id(s.as_ref(), "job/unique-id", deadline))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let id = publish_unique_id(&lib, store.as_ref(), "job/unique-id", deadline).unwrap();
    for r in readers {
        assert_eq!(r.join().unwrap().unwrap(), id);
    }
    // 128 real bytes: not all zero, and a second id differs.
    assert_eq!(id.as_bytes().len(), 128);
    assert!(id.as_bytes().iter().any(|b| *b != 0));
    assert_ne!(lib.unique_id().unwrap(), id);
    // Through a file store (what separate processes use) as well.
    let dir = tempfile::tempdir().unwrap();
    let fs = FileStore::new(dir.path()).unwrap();
    publish_unique_id(&lib, &fs, "g/unique-id", deadline).unwrap();
    let other = FileStore::new(dir.path()).unwrap();
    let got = fetch_unique_id(&other, "g/unique-id", deadline).unwrap();
    assert_eq!(
        got.as_bytes(),
        fs.get("g/unique-id", deadline).unwrap().as_slice()
    );
    // Through the job's TCPStore (torchrun's agent store; what ranks on
    // several nodes use), with a reader that asked before rank 0 published.
    use compiler_collectives_tcpstore::{ServerOptions, TcpStoreClient, TcpStoreServer};
    let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    let port = server.port();
    let reader = std::thread::spawn(move || {
        let c = TcpStoreClient::connect("127.0.0.1", port, deadline).unwrap();
        fetch_unique_id(&c, "ccol/r/0/nccl/unique-id", deadline)
    });
    std::thread::sleep(Duration::from_millis(50));
    let writer = TcpStoreClient::connect("127.0.0.1", port, deadline).unwrap();
    let id = publish_unique_id(&lib, &writer, "ccol/r/0/nccl/unique-id", deadline).unwrap();
    assert_eq!(reader.join().unwrap().unwrap(), id);
}

#[test]
fn fetch_times_out_naming_rank_0() {
    let store = InProcessStore::new();
    let start = Instant::now();
    let err =
        fetch_unique_id(&store, "never", Deadline::after(Duration::from_millis(300))).unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(&err, Error::Timeout { missing_ranks, .. } if missing_ranks == &[0]),
        "{err:?}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1300),
        "{took:?}"
    );
}

#[test]
fn fetch_rejects_bytes_that_are_not_an_id() {
    let store = InProcessStore::new();
    let d = Deadline::after(Duration::from_secs(1));
    for (value, want) in [
        (vec![7u8; 127], "127 bytes, expected 128"),
        (vec![0u8; 128], "all zero"),
    ] {
        store.set("id", &value, d).unwrap();
        let err = fetch_unique_id(&store, "id", d).unwrap_err();
        assert!(
            matches!(&err, Error::Decode { rank: Some(0), .. }) && err.to_string().contains(want),
            "{err}"
        );
    }
    assert!(UniqueId::from_bytes(&[1u8; 128]).is_ok());
}

#[test]
fn communicator_without_a_gpu_is_a_typed_nccl_error() {
    let Some(lib) = lib_without_a_gpu(
        "communicator_without_a_gpu_is_a_typed_nccl_error",
        "; the GPU suite covers communicators",
    ) else {
        return;
    };
    let id = lib.unique_id().unwrap();
    for blocking in [true, false] {
        let start = Instant::now();
        let err = Communicator::init(
            Arc::clone(&lib),
            &id,
            1,
            0,
            blocking,
            Deadline::after(Duration::from_secs(20)),
        )
        .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(20));
        let nccl = nccl_error(&err).unwrap_or_else(|| panic!("not an NCCL error: {err:?}"));
        assert_eq!(nccl.nccl_code(), Some(UNHANDLED_CUDA_ERROR), "{nccl}");
        let text = err.to_string();
        assert!(
            text.contains("ncclCommInitRankConfig failed: ncclUnhandledCudaError (1)"),
            "{text}"
        );
        println!("blocking={blocking}: {text}");
    }
    // A rank outside the group is refused before NCCL is called.
    let err = Communicator::init(
        lib,
        &id,
        2,
        2,
        true,
        Deadline::after(Duration::from_secs(1)),
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[test]
fn transport_without_a_gpu_fails_with_the_probe_error() {
    let Some(lib) = lib_without_a_gpu("transport_without_a_gpu_fails_with_the_probe_error", "")
    else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(InProcessStore::new());
    let err =
        NcclTransport::connect(store, 0, 1, &NcclOptions::default().with_lib(lib)).unwrap_err();
    let nccl = nccl_error(&err).unwrap_or_else(|| panic!("{err:?}"));
    assert!(
        matches!(nccl, NcclError::DriverNotFound | NcclError::NoDevice { .. }),
        "{nccl:?}"
    );
}

/// cudarc's own result-level NCCL calls, which this crate does not rely on:
/// cudarc opens NCCL only by names like `libnccl.so` (never the wheel's
/// `libnccl.so.2`), and glibc reads `LD_LIBRARY_PATH` at start-up. So the
/// test runs itself again with a `libnccl.so` link in a temporary directory
/// on `LD_LIBRARY_PATH`; there cudarc finds NCCL, makes a unique id, and
/// its `comm_init_rank` without a GPU fails with `ncclUnhandledCudaError`.
#[test]
fn cudarc_result_level_init_without_a_gpu() {
    const CHILD: &str = "CCOL_CUDARC_CHILD";
    if std::env::var_os(CHILD).is_some() {
        // SAFETY: only probes whether the library opens.
        assert!(unsafe { cudarc::nccl::sys::is_culib_present() });
        let id = cudarc::nccl::result::get_uniqueid().expect("unique id");
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is a valid out pointer; with no GPU NCCL fails
        // before writing a communicator.
        let res = unsafe { cudarc::nccl::result::comm_init_rank(comm.as_mut_ptr(), 1, id, 0) };
        let err = res.err().expect("no GPU: the init must fail");
        assert_eq!(
            err.0,
            cudarc::nccl::sys::ncclResult_t::ncclUnhandledCudaError
        );
        println!("CUDARC-CHILD-OK");
        return;
    }
    let Some(lib) = lib_without_a_gpu("cudarc_result_level_init_without_a_gpu", "") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let target = std::fs::canonicalize(lib.path()).unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join("libnccl.so")).unwrap();
    let out = run_as_child("cudarc_result_level_init_without_a_gpu", CHILD, |c| {
        c.env("LD_LIBRARY_PATH", dir.path())
    });
    assert_child_ok(&out, "CUDARC-CHILD-OK");
}

/// The default probe in an environment that names no NCCL anywhere (no
/// variable, an empty cache and home, no Python): "not found", listing the
/// places tried, no panic. Runs in a child process so the environment is
/// its own.
#[test]
fn default_probe_without_any_nccl_says_not_found() {
    const CHILD: &str = "CCOL_PROBE_CHILD";
    if std::env::var_os(CHILD).is_some() {
        // A system-wide NCCL (ld cache) would be found by name: nothing to
        // test then. (Checked here: in the parent a library loaded by path
        // answers to its soname.)
        // SAFETY: opening the library runs only its initialisers.
        if unsafe { libloading::Library::new("libnccl.so.2") }.is_ok() {
            println!("PROBE-CHILD-SKIP a system-wide libnccl.so.2 is on the linker path");
            return;
        }
        let err = compiler_collectives_nccl::probe().expect_err("nothing to find");
        let NcclError::LibraryNotFound { tried } = &err else {
            panic!("expected LibraryNotFound, got {err:?}");
        };
        assert!(
            tried
                .iter()
                .any(|t| t.starts_with("libnccl.so.2 (dynamic linker)")),
            "{tried:?}"
        );
        assert!(
            tried
                .iter()
                .any(|t| t.contains("site-packages reported by")),
            "{tried:?}"
        );
        println!("PROBE-CHILD-OK {err}");
        return;
    }
    let empty = tempfile::tempdir().unwrap();
    let out = run_as_child(
        "default_probe_without_any_nccl_says_not_found",
        CHILD,
        |c| {
            for var in [
                "CCOL_NCCL_LIB",
                "VIRTUAL_ENV",
                "CONDA_PREFIX",
                "CCOL_TORCH_PYTHON",
                "LD_LIBRARY_PATH",
            ] {
                c.env_remove(var);
            }
            c.env("CCOL_CACHE", empty.path())
                .env("HOME", empty.path())
                .env("CCOL_PYTHON", empty.path().join("no-python"))
        },
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Some(line) = stdout.lines().find(|l| l.starts_with("PROBE-CHILD-SKIP")) {
        println!("skipped: {}", &line["PROBE-CHILD-SKIP ".len()..]);
        return;
    }
    assert_child_ok(&out, "PROBE-CHILD-OK");
}
