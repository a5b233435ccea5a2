use std::sync::Arc;

use byom_protocol::pb::{self, CommandState};

use crate::*;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open_sled(dir.path()).unwrap();
    (dir, s)
}

fn cmd(id: &str, machine: &str) -> pb::Command {
    pb::Command {
        id: id.into(),
        machine_id: machine.into(),
        state: CommandState::Queued as i32,
        ..Default::default()
    }
}

/// A dispatcher reads the queue while commands are being created (the
/// agents start several at once): none may be dropped from it.
#[test]
fn commands_created_while_the_queue_is_read_stay_queued() {
    let (_d, s) = store();
    let s = Arc::new(s);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            let t = std::time::Instant::now();
            while !done.load(std::sync::atomic::Ordering::SeqCst)
                && t.elapsed() < std::time::Duration::from_secs(30)
            {
                s.pending_commands("mch_a").unwrap();
            }
        })
    };
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..250 {
                    s.create_command(&cmd(&format!("cmd_{w}_{i:03}"), "mch_a"), &[])
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    reader.join().unwrap();
    assert_eq!(s.pending_commands("mch_a").unwrap().len(), 1000);
    assert_eq!(s.pending_count("mch_a").unwrap(), 1000, "the count kept up");
}

/// The queue count follows creates and ends without reading the queue,
/// and a fresh store counts what is there.
#[test]
fn the_queue_count_follows_commands_in_and_out() {
    let (d, s) = store();
    assert_eq!(s.pending_count("mch_a").unwrap(), 0);
    for i in 0..5 {
        s.create_command(&cmd(&format!("cmd_{i}"), "mch_a"), &[])
            .unwrap();
    }
    s.create_command(&cmd("cmd_b", "mch_b"), &[]).unwrap();
    assert_eq!(s.pending_count("mch_a").unwrap(), 5);
    for id in ["cmd_0", "cmd_1"] {
        s.transition(id, &[CommandState::Queued], CommandState::Cancelled, |_| {})
            .unwrap();
    }
    // Ending an ended command again changes nothing.
    s.update_command("cmd_0", |_| Ok(())).unwrap();
    assert_eq!(s.pending_count("mch_a").unwrap(), 3);
    assert_eq!(s.pending_count("mch_b").unwrap(), 1);
    s.flush().unwrap();
    drop(s);
    let s = Store::open_sled(d.path()).unwrap();
    assert_eq!(s.pending_count("mch_a").unwrap(), 3);
}

#[test]
fn idempotency_records_are_kept_then_forgotten() {
    let (_d, s) = store();
    for (k, at) in [("command/admin:a/k1", 100), ("command/admin:a/k2", 300)] {
        let r = pb::IdempotencyRecord {
            object_id: format!("cmd_{k}"),
            created_at_ms: at,
            ..Default::default()
        };
        s.batch(&[Op::idempotency(k, &r)]).unwrap();
    }
    assert_eq!(
        s.get_idempotency("command/admin:a/k1")
            .unwrap()
            .unwrap()
            .object_id,
        "cmd_command/admin:a/k1"
    );
    assert_eq!(s.expire_idempotency(200, usize::MAX).unwrap(), 1);
    assert!(s.get_idempotency("command/admin:a/k1").unwrap().is_none());
    assert!(s.get_idempotency("command/admin:a/k2").unwrap().is_some());
}

/// Messages arriving at once on a new thread all land on one thread.
#[test]
fn a_thread_named_by_many_at_once_is_one_thread() {
    let (_d, s) = store();
    let s = Arc::new(s);
    for round in 0..50 {
        let external = format!("t{round}");
        let ids: Vec<String> = (0..6)
            .map(|i| {
                let (s, external) = (s.clone(), external.clone());
                std::thread::spawn(move || {
                    if let Some(t) = s.find_thread("chat", &external).unwrap() {
                        return t.id;
                    }
                    let t = pb::Thread {
                        id: format!("thr_{round}_{i}"),
                        source: "chat".into(),
                        external,
                        ..Default::default()
                    };
                    s.create_thread(&t).unwrap().id
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    }
    // The losers' records are gone: one thread per name.
    assert_eq!(s.list_threads(1000).unwrap().len(), 50);
}

#[test]
fn snapshot_ids_list_every_snapshot() {
    let (_d, s) = store();
    s.put_snapshot("snp_b", &[7u8; 100_000]).unwrap();
    s.put_snapshot("snp_a", b"x").unwrap();
    assert_eq!(s.snapshot_ids().unwrap(), ["snp_a", "snp_b"]);
    s.delete_snapshot("snp_a").unwrap();
    assert_eq!(s.snapshot_ids().unwrap(), ["snp_b"]);
}

#[test]
fn batch_writes_and_deletes_across_spaces_at_once() {
    let (_d, s) = store();
    s.batch(&[
        Op::put(Space::Agents, b"i/1".to_vec(), b"ev".to_vec()),
        Op::put(Space::Agents, b"r/router".to_vec(), b"{}".to_vec()),
    ])
    .unwrap();
    let t = pb::Trigger {
        id: "trg_x".into(),
        ..Default::default()
    };
    s.batch(&[
        Op::trigger(&t),
        Op::put(Space::Agents, b"r/wrk_1".to_vec(), b"{}".to_vec()),
        Op::delete(Space::Agents, b"i/1".to_vec()),
    ])
    .unwrap();
    assert!(s.get_trigger("trg_x").unwrap().is_some());
    assert!(s.scan_prefix(Space::Agents, "i/", 10).unwrap().is_empty());
    let keys: Vec<String> = s
        .scan_prefix(Space::Agents, "r/", 10)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, ["router", "wrk_1"]);
    s.batch(&[]).unwrap();
}

#[test]
fn command_transitions_are_checked() {
    let (_d, s) = store();
    s.create_command(&cmd("cmd_a", "mch_a"), &[]).unwrap();
    assert_eq!(s.pending_commands("mch_a").unwrap().len(), 1);
    let err = s
        .update_command("cmd_a", |c| {
            c.set_state(CommandState::Exited);
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(err, StoreError::IllegalTransition { .. }));
    let c = s
        .transition(
            "cmd_a",
            &[CommandState::Queued],
            CommandState::Dispatched,
            |_| {},
        )
        .unwrap();
    assert!(c.is_some());
    // A second dispatcher loses the race.
    let c = s
        .transition(
            "cmd_a",
            &[CommandState::Queued],
            CommandState::Dispatched,
            |_| {},
        )
        .unwrap();
    assert!(c.is_none());
    s.transition(
        "cmd_a",
        &[CommandState::Dispatched],
        CommandState::Lost,
        |_| {},
    )
    .unwrap();
    assert!(s.pending_commands("mch_a").unwrap().is_empty());
}

#[test]
fn list_commands_filters_newest_first() {
    let (_d, s) = store();
    for (i, m) in ["mch_a", "mch_b", "mch_a"].iter().enumerate() {
        let mut c = cmd(&format!("cmd_{i}"), m);
        c.created_at_ms = 100 * (i as u64 + 1);
        s.create_command(&c, &[]).unwrap();
    }
    let ids = |v: Vec<pb::Command>| v.into_iter().map(|c| c.id).collect::<Vec<_>>();
    assert_eq!(
        ids(s.list_commands(None, None, 0, 10).unwrap()),
        ["cmd_2", "cmd_1", "cmd_0"]
    );
    assert_eq!(
        ids(s.list_commands(Some("mch_a"), None, 0, 10).unwrap()),
        ["cmd_2", "cmd_0"]
    );
    assert_eq!(
        ids(s.list_commands(None, None, 200, 10).unwrap()),
        ["cmd_2", "cmd_1"]
    );
    assert_eq!(
        ids(s
            .list_commands(None, Some(CommandState::Queued), 0, 1)
            .unwrap()),
        ["cmd_2"]
    );
    assert!(s
        .list_commands(None, Some(CommandState::Exited), 0, 10)
        .unwrap()
        .is_empty());
}

#[test]
fn output_offsets() {
    let (_d, s) = store();
    s.append_output("cmd_a", 1, 0, b"hello ").unwrap();
    s.append_output("cmd_a", 1, 6, b"world").unwrap();
    s.append_output("cmd_a", 2, 0, b"err").unwrap();
    assert_eq!(s.output_len("cmd_a", 1).unwrap(), 11);
    assert_eq!(s.output_len("cmd_a", 2).unwrap(), 3);
    assert_eq!(s.output_len("cmd_b", 1).unwrap(), 0);
    let got = s.read_output("cmd_a", 1, 3, 100).unwrap();
    assert_eq!(got, vec![(3, b"lo ".to_vec()), (6, b"world".to_vec())]);
    assert!(s.read_output("cmd_a", 1, 11, 100).unwrap().is_empty());
}

#[test]
fn token_redeemed_once() {
    let (_d, s) = store();
    let t = pb::Token {
        id: "tok_a".into(),
        secret_sha256: "h".into(),
        expires_at_ms: 100,
        ..Default::default()
    };
    s.create_token(&t, &[]).unwrap();
    assert_eq!(
        s.redeem_token("x", "mch_a", 1).unwrap(),
        Err(RedeemError::Unknown)
    );
    assert!(s.redeem_token("h", "mch_a", 1).unwrap().is_ok());
    assert_eq!(
        s.redeem_token("h", "mch_b", 2).unwrap(),
        Err(RedeemError::Used)
    );
    let t2 = pb::Token {
        id: "tok_b".into(),
        secret_sha256: "h2".into(),
        expires_at_ms: 100,
        ..Default::default()
    };
    s.create_token(&t2, &[]).unwrap();
    assert_eq!(
        s.redeem_token("h2", "mch_a", 100).unwrap(),
        Err(RedeemError::Expired)
    );
}

#[test]
fn machine_names_are_unique() {
    let (_d, s) = store();
    let mut a = pb::Machine {
        id: "mch_a".into(),
        name: "lap".into(),
        ..Default::default()
    };
    let mut b = pb::Machine {
        id: "mch_b".into(),
        name: "lap".into(),
        ..Default::default()
    };
    s.create_machine(&mut a).unwrap();
    s.create_machine(&mut b).unwrap();
    assert_eq!(b.name, "lap-2");
    assert_eq!(s.resolve_machine("lap-2").unwrap().unwrap().id, "mch_b");
    assert!(s.rename_machine("mch_b", "lap").is_err());
    s.rename_machine("mch_b", "desk").unwrap();
    assert_eq!(s.resolve_machine("desk").unwrap().unwrap().id, "mch_b");
    assert!(s.resolve_machine("lap-2").unwrap().is_none());
}

/// A backend whose flushes are slow and recorded (start and end), so the
/// group commit's promise can be checked: every caller returns only after a
/// flush that started after its call ended.
struct SlowFlushes {
    inner: SledBackend,
    t0: std::time::Instant,
    flushes: std::sync::Mutex<Vec<(u128, u128)>>,
}

impl Backend for SlowFlushes {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(space, key)
    }
    fn put(&self, space: Space, key: &[u8], value: &[u8]) -> Result<()> {
        self.inner.put(space, key, value)
    }
    fn delete(&self, space: Space, key: &[u8]) -> Result<()> {
        self.inner.delete(space, key)
    }
    fn compare_and_swap(
        &self,
        space: Space,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        self.inner.compare_and_swap(space, key, old, new)
    }
    fn range(
        &self,
        space: Space,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<Kv>> {
        self.inner.range(space, start, end, reverse, limit)
    }
    fn keys(&self, space: Space) -> Result<Vec<Vec<u8>>> {
        self.inner.keys(space)
    }
    fn flush(&self) -> Result<()> {
        let start = self.t0.elapsed().as_micros();
        std::thread::sleep(std::time::Duration::from_millis(15));
        self.inner.flush()?;
        let end = self.t0.elapsed().as_micros();
        self.flushes.lock().unwrap().push((start, end));
        Ok(())
    }
    fn batch(&self, ops: &[Op]) -> Result<()> {
        self.inner.batch(ops)
    }
}

#[test]
fn concurrent_flushes_are_shared_and_each_covers_its_caller() {
    let dir = tempfile::tempdir().unwrap();
    let kv = Arc::new(SlowFlushes {
        inner: SledBackend::open(dir.path()).unwrap(),
        t0: std::time::Instant::now(),
        flushes: Default::default(),
    });
    let s = Store::new(kv.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    const CALLERS: usize = 64;
    let calls: Vec<(u128, u128)> = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..CALLERS {
            let (s, kv) = (s.clone(), kv.clone());
            tasks.push(tokio::spawn(async move {
                // Spread the calls over a few flushes' time.
                tokio::time::sleep(std::time::Duration::from_millis((i % 8) as u64 * 5)).await;
                s.kv.put(Space::Tokens, format!("k{i}").as_bytes(), b"v")
                    .unwrap();
                let called = kv.t0.elapsed().as_micros();
                s.flush_async().await.unwrap();
                (called, kv.t0.elapsed().as_micros())
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let flushes = kv.flushes.lock().unwrap().clone();
    assert!(
        flushes.len() < CALLERS / 4,
        "{} flushes for {CALLERS} callers: not shared",
        flushes.len()
    );
    for (called, returned) in calls {
        assert!(
            flushes.iter().any(|&(start, end)| start >= called && end <= returned),
            "a caller at {called}µs returned at {returned}µs without a flush that started after it: {flushes:?}"
        );
    }
}

#[test]
fn callers_dropped_mid_flush_do_not_strand_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let kv = Arc::new(SlowFlushes {
        inner: SledBackend::open(dir.path()).unwrap(),
        t0: std::time::Instant::now(),
        flushes: Default::default(),
    });
    let s = Store::new(kv.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for round in 0..5 {
            // Whoever leads this flush is cancelled 2 ms into its 15 ms.
            let leader = s.clone();
            let cancelled = tokio::time::timeout(std::time::Duration::from_millis(2), async move {
                leader.flush_async().await
            })
            .await;
            assert!(cancelled.is_err(), "round {round}: the flush was not slow");
            // A caller after it must still get a flush, promptly.
            tokio::time::timeout(std::time::Duration::from_secs(5), s.flush_async())
                .await
                .unwrap_or_else(|_| panic!("round {round}: stranded by a dropped caller"))
                .unwrap();
        }
    });
    assert!(kv.flushes.lock().unwrap().len() >= 5);
}
