//! `JobStore`: the store torchrun's environment names.

use compiler_collectives_core::{Deadline, RunEnv, Store};
use compiler_collectives_tcpstore::{JobStore, ServerOptions, TcpStoreServer};
use std::collections::HashMap;
use std::time::Duration;

fn env(vars: &[(&str, String)]) -> RunEnv {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    RunEnv::from_vars(|k| vars.get(k).cloned()).expect("a valid environment")
}

fn job_vars(rank: u32, port: u16, agent: bool) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", "3".into()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("TORCHELASTIC_RUN_ID", "run7".into()),
        ("TORCHELASTIC_RESTART_COUNT", "2".into()),
        (
            "TORCHELASTIC_USE_AGENT_STORE",
            if agent { "True" } else { "False" }.into(),
        ),
    ]
}

/// Three ranks meet through the store: each sets its key, gets the others'.
fn meet(port: u16, agent: bool) -> Result<Vec<bool>, String> {
    let ranks: Vec<_> = (0..3u32)
        .map(|rank| {
            std::thread::spawn(move || {
                let d = Deadline::after(Duration::from_secs(10));
                let job = JobStore::from_run_env(&env(&job_vars(rank, port, agent)), d)
                    .map_err(|e| e.to_string())?
                    .ok_or("no store for a set MASTER_PORT")?;
                let key = |r: u32| format!("{}r{r}", job.prefix());
                job.set(&key(rank), &rank.to_le_bytes(), d)
                    .map_err(|e| e.to_string())?;
                for r in 0..3 {
                    let v = job.get(&key(r), d).map_err(|e| e.to_string())?;
                    assert_eq!(v, r.to_le_bytes());
                }
                // Rank 0 serves: it stays until every rank said it is done.
                job.add(&format!("{}done", job.prefix()), 1, d)
                    .map_err(|e| e.to_string())?;
                let done = format!("{}all-done", job.prefix());
                if job
                    .add(&format!("{}done", job.prefix()), 0, d)
                    .map_err(|e| e.to_string())?
                    == 3
                {
                    job.set(&done, b"", d).map_err(|e| e.to_string())?;
                }
                job.linger(&[done.as_str()], Duration::from_secs(10));
                assert_eq!(job.prefix(), "ccol/run7/2/");
                Ok::<_, String>(job.serves())
            })
        })
        .collect();
    ranks
        .into_iter()
        .map(|h| h.join().map_err(|_| "a rank panicked".to_string())?)
        .collect()
}

#[test]
fn under_an_agent_every_rank_is_a_client() {
    let agent = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    assert_eq!(meet(agent.port(), true).unwrap(), [false, false, false]);
    assert!(agent.num_keys() >= 3);
}

#[test]
fn without_an_agent_rank_0_serves_on_master_port() {
    // The port must be known to every rank before rank 0 binds it, so it
    // is picked by binding and closing; another process taking it in
    // between makes rank 0 a client of a stranger, and the round is tried
    // again on another port.
    let mut last = String::new();
    for _ in 0..3 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        match meet(port, false) {
            Ok(serves) => {
                assert_eq!(serves, [true, false, false]);
                return;
            }
            Err(e) => last = e,
        }
    }
    panic!("three rounds failed; the last: {last}");
}

#[test]
fn a_rank_0_whose_port_is_taken_uses_the_store_there() {
    let there = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    assert_eq!(meet(there.port(), false).unwrap(), [false, false, false]);
}

#[test]
fn no_master_port_no_job_store() {
    let vars = vec![("RANK", "0".to_owned()), ("WORLD_SIZE", "1".to_owned())];
    let d = Deadline::after(Duration::from_secs(1));
    assert!(JobStore::from_run_env(&env(&vars), d).unwrap().is_none());
}
