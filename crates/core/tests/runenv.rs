//! `RunEnv`: torchrun's variables, the launch id and the directory-name rule.
//!
//! Table tests, one `check_*` helper per table and one case per line, over
//! `RunEnv::from_vars` (no test changes the process's environment).
//! Variables are written `NAME=value;NAME=value` (the value is everything
//! after `=` up to `;`, spaces included). A parsed `RunEnv` is written
//! `rank R/W local L/LW node G master ADDR:PORT run ID restart N agent B
//! error_file PATH` (`-` for `None`); an error as `err ` and its message.

use compiler_collectives_core::launch::runenv::{
    dir_safe, JobStoreAt, RunEnv, StoreChoice, MAX_DIR_NAME,
};
use compiler_collectives_core::Error;
use std::path::Path;

fn parse(vars: &str) -> Result<RunEnv, Error> {
    let pairs: Vec<(String, String)> = vars
        .split(';')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .unwrap_or_else(|| panic!("bad case {p:?}"));
            (k.trim().to_owned(), v.to_owned())
        })
        .collect();
    RunEnv::from_vars(|name| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn err(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) => format!("err {m}"),
        other => panic!("not InvalidArgument: {other:?}"),
    }
}

/// `from_vars(vars)` rendered (module docs).
#[track_caller]
fn check(vars: &str, expect: &str) {
    let got = match parse(vars) {
        Ok(e) => format!(
            "rank {}/{} local {}/{} node {} master {}:{} run {} restart {} agent {} error_file {}",
            e.rank,
            e.world_size,
            e.local_rank,
            e.local_world_size,
            e.group_rank,
            e.master_addr,
            opt(e.master_port),
            opt(e.run_id.as_deref()),
            e.restart_count,
            e.use_agent_store,
            opt(e.error_file.as_ref().map(|p| p.display())),
        ),
        Err(e) => err(e),
    };
    assert_eq!(got, expect, "vars: {vars:?}");
}

#[test]
#[rustfmt::skip] // one case per line
fn every_variable() {
    // Required: RANK and WORLD_SIZE; every other variable has a default.
    check("RANK=0;WORLD_SIZE=1", "rank 0/1 local 0/1 node 0 master 127.0.0.1:- run - restart 0 agent false error_file -");
    check("", "err RANK is not set: start the ranks with `ccol run` or `torchrun`");
    check("WORLD_SIZE=2", "err RANK is not set: start the ranks with `ccol run` or `torchrun`");
    check("RANK=0", "err WORLD_SIZE is not set: start the ranks with `ccol run` or `torchrun`");
    check("RANK=;WORLD_SIZE=2", "err RANK is not set: start the ranks with `ccol run` or `torchrun`");
    check("RANK= 1 ;WORLD_SIZE=2 ", "rank 1/2 local 0/2 node 0 master 127.0.0.1:- run - restart 0 agent false error_file -");
    check("RANK=x;WORLD_SIZE=2", r#"err RANK="x" is not a non-negative integer"#);
    check("RANK=-1;WORLD_SIZE=2", r#"err RANK="-1" is not a non-negative integer"#);
    check("RANK=0;WORLD_SIZE=4294967296", r#"err WORLD_SIZE="4294967296" is not a non-negative integer"#);
    check("RANK=2;WORLD_SIZE=2", "err RANK=2 is not below WORLD_SIZE=2");
    check("RANK=0;WORLD_SIZE=0", "err RANK=0 is not below WORLD_SIZE=0");
    // LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE.
    check("RANK=3;WORLD_SIZE=4;LOCAL_RANK=1;LOCAL_WORLD_SIZE=2;GROUP_RANK=1", "rank 3/4 local 1/2 node 1 master 127.0.0.1:- run - restart 0 agent false error_file -");
    check("RANK=1;WORLD_SIZE=2;LOCAL_RANK=1", "rank 1/2 local 1/2 node 0 master 127.0.0.1:- run - restart 0 agent false error_file -");
    check("RANK=1;WORLD_SIZE=2;LOCAL_WORLD_SIZE=0", "err LOCAL_WORLD_SIZE=0 is not between 1 and WORLD_SIZE=2");
    check("RANK=1;WORLD_SIZE=2;LOCAL_WORLD_SIZE=3", "err LOCAL_WORLD_SIZE=3 is not between 1 and WORLD_SIZE=2");
    check("RANK=1;WORLD_SIZE=2;LOCAL_WORLD_SIZE=two", r#"err LOCAL_WORLD_SIZE="two" is not a non-negative integer"#);
    check("RANK=1;WORLD_SIZE=2;LOCAL_RANK=1;LOCAL_WORLD_SIZE=1", "err LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1");
    check("RANK=1;WORLD_SIZE=2;LOCAL_RANK=2", "err LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
    check("RANK=1;WORLD_SIZE=2;LOCAL_RANK=gpu1", r#"err LOCAL_RANK="gpu1" is not a non-negative integer"#);
    check("RANK=1;WORLD_SIZE=2;GROUP_RANK=n1", r#"err GROUP_RANK="n1" is not a non-negative integer"#);
    // MASTER_ADDR, MASTER_PORT.
    check("RANK=0;WORLD_SIZE=1;MASTER_ADDR=10.0.0.5;MASTER_PORT=29500", "rank 0/1 local 0/1 node 0 master 10.0.0.5:29500 run - restart 0 agent false error_file -");
    check("RANK=0;WORLD_SIZE=1;MASTER_ADDR=;MASTER_PORT=0", "rank 0/1 local 0/1 node 0 master 127.0.0.1:0 run - restart 0 agent false error_file -");
    check("RANK=0;WORLD_SIZE=1;MASTER_PORT=65536", r#"err MASTER_PORT="65536" is not a port number (0-65535)"#);
    check("RANK=0;WORLD_SIZE=1;MASTER_PORT=http", r#"err MASTER_PORT="http" is not a port number (0-65535)"#);
    // TORCHELASTIC_*: the run id raw, the restart count a number.
    check("RANK=0;WORLD_SIZE=1;TORCHELASTIC_RUN_ID=none", "rank 0/1 local 0/1 node 0 master 127.0.0.1:- run none restart 0 agent false error_file -");
    check("RANK=0;WORLD_SIZE=1;TORCHELASTIC_RUN_ID=a/b c", "rank 0/1 local 0/1 node 0 master 127.0.0.1:- run a/b c restart 0 agent false error_file -");
    check("RANK=0;WORLD_SIZE=1;TORCHELASTIC_RESTART_COUNT=3", "rank 0/1 local 0/1 node 0 master 127.0.0.1:- run - restart 3 agent false error_file -");
    check("RANK=0;WORLD_SIZE=1;TORCHELASTIC_RESTART_COUNT=again", r#"err TORCHELASTIC_RESTART_COUNT="again" is not a non-negative integer"#);
    check("RANK=0;WORLD_SIZE=1;TORCHELASTIC_USE_AGENT_STORE=True", "rank 0/1 local 0/1 node 0 master 127.0.0.1:- run - restart 0 agent true error_file -");
    check("RANK=0;WORLD_SIZE=1;TORCHELASTIC_USE_AGENT_STORE=true", "rank 0/1 local 0/1 node 0 master 127.0.0.1:- run - restart 0 agent true error_file -");
    check("RANK=0;WORLD_SIZE=1;TORCHELASTIC_USE_AGENT_STORE=False", "rank 0/1 local 0/1 node 0 master 127.0.0.1:- run - restart 0 agent false error_file -");
    check("RANK=0;WORLD_SIZE=1;TORCHELASTIC_USE_AGENT_STORE=1", "rank 0/1 local 0/1 node 0 master 127.0.0.1:- run - restart 0 agent false error_file -");
    check("RANK=0;WORLD_SIZE=1;TORCHELASTIC_ERROR_FILE=/tmp/r0/error.json", "rank 0/1 local 0/1 node 0 master 127.0.0.1:- run - restart 0 agent false error_file /tmp/r0/error.json");
}

/// `launch_id("set CCOL_X_STORE")`, `local_store_dir("/tmp", "x", …)` and
/// `key_prefix()` for `RANK=0;WORLD_SIZE=2;` followed by `vars`:
/// `id ID dir DIR prefix P` (`dir err MESSAGE` when only the directory
/// fails), or `err MESSAGE prefix P`.
#[track_caller]
fn check_launch(vars: &str, expect: &str) {
    let env = parse(&format!("RANK=0;WORLD_SIZE=2;{vars}")).expect("parses");
    let remedy = "set CCOL_X_STORE";
    let got = match env.launch_id(remedy) {
        Ok(id) => {
            let dir = match env.local_store_dir(Path::new("/tmp"), "x", remedy) {
                Ok(d) => d.display().to_string(),
                Err(e) => err(e),
            };
            format!("id {id} dir {dir} prefix {}", env.key_prefix())
        }
        Err(e) => {
            let e = err(e);
            let dir = env.local_store_dir(Path::new("/tmp"), "x", remedy);
            assert_eq!(dir.map_err(err), Err(e.clone()), "the same error");
            format!("{e} prefix {}", env.key_prefix())
        }
    };
    assert_eq!(got, expect, "vars: {vars:?}");
}

#[test]
#[rustfmt::skip] // one case per line
fn launch_id_and_prefix() {
    check_launch("TORCHELASTIC_RUN_ID=4f2a-9c;MASTER_PORT=29500", "id 4f2a-9c-29500-0 dir /tmp/ccol-x-4f2a-9c-29500-0 prefix 4f2a-9c/0");
    check_launch("TORCHELASTIC_RUN_ID=4f2a-9c", "id 4f2a-9c-0-0 dir /tmp/ccol-x-4f2a-9c-0-0 prefix 4f2a-9c/0");
    check_launch("TORCHELASTIC_RUN_ID=4f2a-9c;MASTER_PORT=29500;TORCHELASTIC_RESTART_COUNT=2", "id 4f2a-9c-29500-2 dir /tmp/ccol-x-4f2a-9c-29500-2 prefix 4f2a-9c/2");
    check_launch("TORCHELASTIC_RUN_ID=job/7.x", "id job_7_x-0-0 dir /tmp/ccol-x-job_7_x-0-0 prefix job/7.x/0");
    check_launch("TORCHELASTIC_RUN_ID=job/7.x;LOCAL_WORLD_SIZE=1", "id job_7_x-0-0 dir err ranks span several nodes (LOCAL_WORLD_SIZE=1, WORLD_SIZE=2), so a directory on this node reaches only some of them: set CCOL_X_STORE prefix job/7.x/0");
    // torchrun's default (no --standalone, no --rdzv-id): the same at every launch.
    check_launch("TORCHELASTIC_RUN_ID=none;MASTER_PORT=29500", "err TORCHELASTIC_RUN_ID is torchrun's default 'none', the same at every launch: a store derived from it may hold an earlier launch's keys; start torchrun with --standalone or --rdzv-id=<an id unique to this launch> (`ccol run` sets a fresh one), or set CCOL_X_STORE prefix none/0");
    check_launch("TORCHELASTIC_RUN_ID=none;LOCAL_WORLD_SIZE=1", "err TORCHELASTIC_RUN_ID is torchrun's default 'none', the same at every launch: a store derived from it may hold an earlier launch's keys; start torchrun with --standalone or --rdzv-id=<an id unique to this launch> (`ccol run` sets a fresh one), or set CCOL_X_STORE prefix none/0");
    check_launch("TORCHELASTIC_RUN_ID=None", "id None-0-0 dir /tmp/ccol-x-None-0-0 prefix None/0");
    check_launch("", "err TORCHELASTIC_RUN_ID is not set, so no store can be derived for this launch: start torchrun with --standalone or --rdzv-id=<an id unique to this launch> (`ccol run` sets a fresh one), or set CCOL_X_STORE prefix job/0");
    check_launch("TORCHELASTIC_RUN_ID=", "err TORCHELASTIC_RUN_ID is not set, so no store can be derived for this launch: start torchrun with --standalone or --rdzv-id=<an id unique to this launch> (`ccol run` sets a fresh one), or set CCOL_X_STORE prefix job/0");
}

/// `dir_safe(raw)`.
#[track_caller]
fn check_dir_safe(raw: &str, expect: &str) {
    let got = dir_safe(raw);
    assert_eq!(got, expect, "raw: {raw:?}");
    assert!(got.len() <= MAX_DIR_NAME, "{got}");
}

#[test]
#[rustfmt::skip] // one case per line
fn dir_names() {
    check_dir_safe("abc-DEF-123", "abc-DEF-123");
    check_dir_safe("a_b", "a_b");
    check_dir_safe("a.b/c d", "a_b_c_d");
    check_dir_safe("..", "__");
    check_dir_safe("/", "_");
    check_dir_safe("é-日本", "_-__");
    check_dir_safe("tab\there", "tab_here");
    check_dir_safe("", "");
    check_dir_safe(&"a".repeat(128), &"a".repeat(128));
    // Longer than 128 bytes: the first 111, `-`, XXH3-64 of the whole id.
    check_dir_safe(&"a".repeat(129), &format!("{}-1586e7ed07cba75b", "a".repeat(111)));
    check_dir_safe(&format!("{}b", "a".repeat(200)), &format!("{}-e74c710dd58ad511", "a".repeat(111)));
}

/// The job's TCPStore: none without MASTER_PORT; rank 0 serves it unless
/// an agent does.
#[test]
fn the_job_store_and_who_serves_it() {
    let at = |vars: &str| parse(vars).expect("valid").job_store();
    let store = |serve| {
        Some(JobStoreAt {
            host: "10.0.0.7".into(),
            port: 29511,
            serve,
        })
    };
    let job = "WORLD_SIZE=2;MASTER_ADDR=10.0.0.7;MASTER_PORT=29511";
    assert_eq!(at("RANK=0;WORLD_SIZE=2;MASTER_ADDR=10.0.0.7"), None);
    assert_eq!(at(&format!("RANK=0;{job}")), store(true));
    assert_eq!(at(&format!("RANK=1;{job}")), store(false));
    assert_eq!(
        at(&format!("RANK=0;{job};TORCHELASTIC_USE_AGENT_STORE=True")),
        store(false)
    );
}

#[test]
fn the_store_choice_named_then_the_job_store_then_a_local_directory() {
    let choose = |vars: &str, named: Option<&str>| {
        parse(vars).expect("valid").store_choice(
            named.map(str::to_owned),
            "CCOL_X_STORE",
            "x",
            "a directory",
        )
    };
    let job = "RANK=1;WORLD_SIZE=2;MASTER_ADDR=10.0.0.7;MASTER_PORT=29511";
    let local = "RANK=1;WORLD_SIZE=2;LOCAL_WORLD_SIZE=2;TORCHELASTIC_RUN_ID=abc";
    assert_eq!(
        choose(job, Some("/shared/dir")).unwrap(),
        StoreChoice::Named("/shared/dir".into())
    );
    assert_eq!(
        choose(job, Some("")).unwrap(),
        StoreChoice::Job(JobStoreAt {
            host: "10.0.0.7".into(),
            port: 29511,
            serve: false,
        })
    );
    match choose(local, None).unwrap() {
        StoreChoice::LocalDir(dir) => {
            assert_eq!(dir.parent(), Some(std::env::temp_dir().as_path()));
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            assert!(name.starts_with("ccol-x-abc"), "{name}");
        }
        other => panic!("{other:?}"),
    }
    let e = err(choose("RANK=1;WORLD_SIZE=2;LOCAL_WORLD_SIZE=2", None).unwrap_err());
    assert!(
        e.contains(
            "set MASTER_ADDR and MASTER_PORT (the job's TCPStore), or CCOL_X_STORE to a directory"
        ),
        "{e}"
    );
}
