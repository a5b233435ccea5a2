use std::sync::Arc;

use byom_protocol::pb::{self, CommandState};

use crate::pg_backend::POOL_SIZE;
use crate::*;

/// Where a test's store lives; `open` may be called again to see what a
/// fresh server would.
enum Fixture {
    Sled(tempfile::TempDir),
    Postgres {
        /// Kept running for the test.
        _cluster: Arc<crate::testing::PgCluster>,
        url: String,
    },
}

impl Fixture {
    fn open(&self) -> Store {
        match self {
            // A store just dropped may still hold sled's lock for a moment
            // (its flusher thread ends on its own time).
            Fixture::Sled(d) => {
                let mut tries = 0;
                loop {
                    match Store::open_sled(d.path()) {
                        Ok(s) => break s,
                        Err(e) if tries < 50 && e.to_string().contains("another") => {
                            tries += 1;
                            std::thread::sleep(std::time::Duration::from_millis(100));
                        }
                        Err(e) => panic!("cannot reopen the sled store: {e}"),
                    }
                }
            }
            Fixture::Postgres { url, .. } => Store::new(Arc::new(PgBackend::connect(url).unwrap())),
        }
    }
}

/// Runs `test` on each backend: the store's behaviour must not depend on it.
fn both(test: impl Fn(&Fixture)) {
    eprintln!("on sled");
    test(&Fixture::Sled(tempfile::tempdir().unwrap()));
    eprintln!("on PostgreSQL");
    let pg = crate::testing::PgCluster::shared();
    let url = pg.fresh_url();
    test(&Fixture::Postgres { _cluster: pg, url });
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
    both(|f| {
        let s = f.open();
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
    });
}

/// The queue count follows creates and ends without reading the queue,
/// and a fresh store counts what is there.
#[test]
fn the_queue_count_follows_commands_in_and_out() {
    both(|f| {
        let s = f.open();
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
        let s = f.open();
        assert_eq!(s.pending_count("mch_a").unwrap(), 3);
    });
}

#[test]
fn idempotency_records_are_kept_then_forgotten() {
    both(|f| {
        let s = f.open();
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
    });
}

/// Messages arriving at once on a new thread all land on one thread.
#[test]
fn a_thread_named_by_many_at_once_is_one_thread() {
    both(|f| {
        let s = f.open();
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
    });
}

#[test]
fn snapshot_ids_list_every_snapshot() {
    both(|f| {
        let s = f.open();
        s.put_snapshot("snp_b", &[7u8; 100_000]).unwrap();
        s.put_snapshot("snp_a", b"x").unwrap();
        assert_eq!(s.snapshot_ids().unwrap(), ["snp_a", "snp_b"]);
        s.delete_snapshot("snp_a").unwrap();
        assert_eq!(s.snapshot_ids().unwrap(), ["snp_b"]);
    });
}

#[test]
fn batch_writes_and_deletes_across_spaces_at_once() {
    both(|f| {
        let s = f.open();
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
    });
}

#[test]
fn command_transitions_are_checked() {
    both(|f| {
        let s = f.open();
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
    });
}

/// A replica updates a command from what it last wrote, without reading
/// it: when another replica changed it meanwhile, the guarded write fails
/// and it reads; nothing the other wrote is lost or overruled.
#[test]
fn an_update_from_a_stale_copy_never_overrules_another_writer() {
    both(|f| {
        let a = f.open();
        let b = Store::new(a.kv.clone());
        let get = |id: &str| a.get_command(id).unwrap().unwrap();

        // The other replica cancelled it: this one's dispatch loses.
        a.create_command(&cmd("cmd_g1", "mch_g"), &[]).unwrap();
        b.transition(
            "cmd_g1",
            &[CommandState::Queued],
            CommandState::Cancelled,
            |c| c.reason = "by b".into(),
        )
        .unwrap()
        .unwrap();
        let r = a
            .transition(
                "cmd_g1",
                &[CommandState::Queued],
                CommandState::Dispatched,
                |_| {},
            )
            .unwrap();
        assert!(r.is_none(), "dispatched a cancelled command: {r:?}");
        assert_eq!(get("cmd_g1").state(), CommandState::Cancelled);
        assert_eq!(get("cmd_g1").reason, "by b");

        // The other replica changed a field: kept through this one's change.
        a.create_command(&cmd("cmd_g2", "mch_g"), &[]).unwrap();
        b.update_command("cmd_g2", |c| {
            c.cancel_requested = true;
            Ok(())
        })
        .unwrap();
        let c = a
            .transition(
                "cmd_g2",
                &[CommandState::Queued],
                CommandState::Dispatched,
                |_| {},
            )
            .unwrap()
            .unwrap();
        assert!(c.cancel_requested);
        assert_eq!(get("cmd_g2"), c);

        // What a stale copy would skip or refuse is judged on the record.
        a.create_command(&cmd("cmd_g3", "mch_g"), &[]).unwrap();
        b.transition(
            "cmd_g3",
            &[CommandState::Queued],
            CommandState::Dispatched,
            |_| {},
        )
        .unwrap()
        .unwrap();
        let c = a
            .transition(
                "cmd_g3",
                &[CommandState::Dispatched],
                CommandState::Running,
                |_| {},
            )
            .unwrap();
        assert_eq!(c.map(|c| c.state()), Some(CommandState::Running));
        a.create_command(&cmd("cmd_g5", "mch_g"), &[]).unwrap();
        for to in [CommandState::Dispatched, CommandState::Running] {
            b.update_command("cmd_g5", |c| {
                c.set_state(to);
                Ok(())
            })
            .unwrap();
        }
        // Queued (its copy) cannot become exited; running (the record) can.
        let c = a
            .update_command("cmd_g5", |c| {
                c.set_state(CommandState::Exited);
                Ok(())
            })
            .unwrap();
        assert_eq!(get("cmd_g5"), c);

        // Its own copy, current: each step is stored, and the ends leave
        // the queue.
        a.create_command(&cmd("cmd_g4", "mch_g"), &[]).unwrap();
        for to in [
            CommandState::Dispatched,
            CommandState::Running,
            CommandState::Exited,
        ] {
            let c = a
                .update_command("cmd_g4", |c| {
                    c.set_state(to);
                    c.pid += 1;
                    Ok(())
                })
                .unwrap();
            assert_eq!(get("cmd_g4"), c);
        }
        assert_eq!(get("cmd_g4").pid, 3);
        let left: Vec<String> = a
            .pending_commands("mch_g")
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        // Only those still dispatched or running.
        assert_eq!(left, ["cmd_g2", "cmd_g3"]);
    });
}

#[test]
fn list_commands_filters_newest_first() {
    both(|f| {
        let s = f.open();
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
    });
}

#[test]
fn output_offsets() {
    both(|f| {
        let s = f.open();
        s.append_output("cmd_a", 1, 0, b"hello ").unwrap();
        s.append_output("cmd_a", 1, 6, b"world").unwrap();
        s.append_output("cmd_a", 2, 0, b"err").unwrap();
        assert_eq!(s.output_len("cmd_a", 1).unwrap(), 11);
        assert_eq!(s.output_len("cmd_a", 2).unwrap(), 3);
        assert_eq!(s.output_len("cmd_b", 1).unwrap(), 0);
        let got = s.read_output("cmd_a", 1, 3, 100).unwrap();
        assert_eq!(got, vec![(3, b"lo ".to_vec()), (6, b"world".to_vec())]);
        assert!(s.read_output("cmd_a", 1, 11, 100).unwrap().is_empty());
    });
}

/// A reusable token's uses are counted exactly under racing pairings:
/// never more than `max_uses` succeed, and none is lost.
#[test]
fn a_reusable_token_counts_racing_uses_exactly() {
    both(|f| {
        let s = f.open();
        let t = pb::Token {
            id: "tok_r".into(),
            secret_sha256: "hr".into(),
            expires_at_ms: u64::MAX,
            reusable: true,
            max_uses: 5,
            ..Default::default()
        };
        s.create_token(&t, &[]).unwrap();
        let threads: Vec<_> = (0..12)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || s.redeem_token("hr", &format!("mch_{i}"), 1).unwrap())
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 5, "{results:?}");
        assert!(results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| *e == RedeemError::UsedUp(5)));
        assert_eq!(s.get_token("tok_r").unwrap().unwrap().uses, 5);
        // Without a limit it goes on until it expires.
        let t = pb::Token {
            id: "tok_u".into(),
            secret_sha256: "hu".into(),
            expires_at_ms: 10,
            reusable: true,
            ..Default::default()
        };
        s.create_token(&t, &[]).unwrap();
        for i in 0..20 {
            assert!(s
                .redeem_token("hu", &format!("mch_{i}"), 1)
                .unwrap()
                .is_ok());
        }
        assert_eq!(
            s.redeem_token("hu", "mch_x", 10).unwrap(),
            Err(RedeemError::Expired)
        );
    });
}

#[test]
fn token_redeemed_once() {
    both(|f| {
        let s = f.open();
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
    });
}

#[test]
fn machine_names_are_unique() {
    both(|f| {
        let s = f.open();
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
    });
}

/// A name this process resolved before is confirmed by the machine's own
/// record: another process renaming or revoking the machine and giving the
/// name to a new one is seen at once.
#[test]
fn a_remembered_name_never_outlives_its_machine() {
    both(|f| {
        let here = f.open();
        // Another server sharing the store, with memories of its own.
        let there = Store::new(here.kv.clone());
        let machine = |id: &str| pb::Machine {
            id: id.into(),
            name: "lap".into(),
            ..Default::default()
        };
        let resolve = |name: &str| here.resolve_machine(name).unwrap().map(|m| m.id);
        there.create_machine(&mut machine("mch_a")).unwrap();
        assert_eq!(resolve("lap").as_deref(), Some("mch_a"));
        assert_eq!(resolve("lap").as_deref(), Some("mch_a"));
        // Renamed there; the name goes to a new machine.
        there.rename_machine("mch_a", "desk").unwrap();
        there.create_machine(&mut machine("mch_b")).unwrap();
        assert_eq!(resolve("lap").as_deref(), Some("mch_b"));
        assert_eq!(resolve("desk").as_deref(), Some("mch_a"));
        // Revoked there (its name released); the name is paired again.
        there
            .update_machine("mch_b", |m| {
                m.revoked = true;
                Ok(())
            })
            .unwrap();
        there.release_machine_name("lap", "mch_b").unwrap();
        assert_eq!(resolve("lap"), None);
        there.create_machine(&mut machine("mch_c")).unwrap();
        assert_eq!(resolve("lap").as_deref(), Some("mch_c"));
        // Forgotten there.
        there.delete_machine("mch_c").unwrap();
        assert_eq!(resolve("lap"), None);
    });
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
    fn batch_if(&self, guard: &Guard, ops: &[Op]) -> Result<bool> {
        self.inner.batch_if(guard, ops)
    }
}

/// A store on [`SlowFlushes`] and a runtime with `threads` workers.
fn slow_flushes(
    threads: usize,
) -> (
    tempfile::TempDir,
    Arc<SlowFlushes>,
    Store,
    tokio::runtime::Runtime,
) {
    let dir = tempfile::tempdir().unwrap();
    let kv = Arc::new(SlowFlushes {
        inner: SledBackend::open(dir.path()).unwrap(),
        t0: std::time::Instant::now(),
        flushes: Default::default(),
    });
    let s = Store::new(kv.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    (dir, kv, s, rt)
}

#[test]
fn concurrent_flushes_are_shared_and_each_covers_its_caller() {
    let (_dir, kv, s, rt) = slow_flushes(4);
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
    let (_dir, kv, s, rt) = slow_flushes(2);
    let ms = std::time::Duration::from_millis;
    rt.block_on(async {
        // A round proves something only if the waiter was dropped while the
        // leader's flush ran; on a loaded machine this task may wake after
        // the flush ended, and that round is run again (bounded).
        let mut proved = 0;
        for round in 0..50 {
            if proved == 5 {
                break;
            }
            // The leader flushes without yielding: a timeout cannot drop it
            // between its flush and the announcement.
            let led = tokio::time::timeout(ms(2), s.flush_async()).await;
            assert!(led.is_ok(), "round {round}: a leader was dropped mid-flush");
            // One waiting for another's flush is dropped 2 ms into its 15 ms.
            let s1 = s.clone();
            let leader = tokio::spawn(async move { s1.flush_async().await });
            for _ in 0..1000 {
                if s.group.lock().running {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_micros(100)).await;
            }
            let waited = tokio::time::timeout(ms(2), s.flush_async()).await;
            if waited.is_err() {
                proved += 1;
            }
            leader.await.unwrap().unwrap();
            // A caller after them still gets a flush, promptly.
            tokio::time::timeout(std::time::Duration::from_secs(5), s.flush_async())
                .await
                .unwrap_or_else(|_| panic!("round {round}: stranded by a dropped caller"))
                .unwrap();
        }
        assert_eq!(proved, 5, "too few rounds dropped a waiter mid-flush");
    });
    assert!(kv.flushes.lock().unwrap().len() >= 15);
}

/// The same random operations on sled and on PostgreSQL give the same
/// answers: the PostgreSQL backend meets the contract sled defines.
#[test]
fn postgres_answers_as_sled_does() {
    let dir = tempfile::tempdir().unwrap();
    let sled = SledBackend::open(dir.path()).unwrap();
    let cluster = crate::testing::PgCluster::shared();
    let pg = PgBackend::connect(&cluster.url("diff")).unwrap();
    fastrand::seed(7);
    // Few keys, some sharing prefixes and bytes above 0x7f, so that ranges,
    // CAS and batches collide often.
    let key = || -> Vec<u8> {
        let n = fastrand::usize(0..4);
        (0..n)
            .map(|_| *fastrand::choice(&[0u8, 1, b'a', b'b', 0x80, 0xff]).unwrap())
            .collect()
    };
    let spaces = [Space::Commands, Space::Pending, Space::Output];
    for step in 0..1500 {
        let space = *fastrand::choice(&spaces).unwrap();
        let k = key();
        let v = vec![fastrand::u8(..); fastrand::usize(0..3)];
        let what = fastrand::u8(0..9);
        let mut dbg = String::new();
        let bound = |k: Vec<u8>| -> Bound<Vec<u8>> {
            match fastrand::u8(0..3) {
                0 => Bound::Unbounded,
                1 => Bound::Included(k),
                _ => Bound::Excluded(k),
            }
        };
        let (a, b) = match what {
            0 => (
                format!("{:?}", sled.get(space, &k)),
                format!("{:?}", pg.get(space, &k)),
            ),
            1 => (
                format!("{:?}", sled.put(space, &k, &v)),
                format!("{:?}", pg.put(space, &k, &v)),
            ),
            2 => (
                format!("{:?}", sled.delete(space, &k)),
                format!("{:?}", pg.delete(space, &k)),
            ),
            3 => {
                let old = sled.get(space, &k).unwrap();
                // Half the time the right old value, else a guess.
                let old = if fastrand::bool() {
                    old
                } else {
                    fastrand::bool().then(|| v.clone())
                };
                let new = fastrand::bool().then(|| vec![fastrand::u8(..)]);
                (
                    format!(
                        "{:?}",
                        sled.compare_and_swap(space, &k, old.as_deref(), new.as_deref())
                    ),
                    format!(
                        "{:?}",
                        pg.compare_and_swap(space, &k, old.as_deref(), new.as_deref())
                    ),
                )
            }
            4 => {
                let (s, e) = (bound(k.clone()), bound(key()));
                let (rev, limit) = (fastrand::bool(), fastrand::usize(0..6));
                dbg = format!("{s:?} {e:?} reverse {rev} limit {limit}");
                fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
                    match b {
                        Bound::Unbounded => Bound::Unbounded,
                        Bound::Included(k) => Bound::Included(&k[..]),
                        Bound::Excluded(k) => Bound::Excluded(&k[..]),
                    }
                }
                (
                    format!(
                        "{:?}",
                        sled.range(space, as_ref(&s), as_ref(&e), rev, limit)
                    ),
                    format!("{:?}", pg.range(space, as_ref(&s), as_ref(&e), rev, limit)),
                )
            }
            5 => (
                format!("{:?}", sled.keys(space)),
                format!("{:?}", pg.keys(space)),
            ),
            6 => {
                // Guarded on the value there now half the time, else on a guess.
                let now = sled.get(space, &k).unwrap();
                let value = match now {
                    Some(v) if fastrand::bool() => v,
                    _ => vec![fastrand::u8(..)],
                };
                let guard = Guard {
                    space,
                    key: k.clone(),
                    value,
                };
                let ops = [
                    Op::put(*fastrand::choice(&spaces).unwrap(), key(), vec![1]),
                    Op::delete(space, key()),
                ];
                (
                    format!("{:?}", sled.batch_if(&guard, &ops)),
                    format!("{:?}", pg.batch_if(&guard, &ops)),
                )
            }
            8 => {
                // Some present, some not, some twice.
                let mut keys: Vec<Vec<u8>> = (0..fastrand::usize(0..4)).map(|_| key()).collect();
                keys.push(k.clone());
                keys.push(k.clone());
                (
                    format!("{:?}", sled.get_many(space, &keys)),
                    format!("{:?}", pg.get_many(space, &keys)),
                )
            }
            _ => {
                let ops: Vec<Op> = (0..fastrand::usize(0..6))
                    .map(|_| {
                        let s = *fastrand::choice(&spaces).unwrap();
                        if fastrand::bool() {
                            Op::put(s, key(), vec![fastrand::u8(..)])
                        } else {
                            Op::delete(s, key())
                        }
                    })
                    .collect();
                (
                    format!("{:?}", sled.batch(&ops)),
                    format!("{:?}", pg.batch(&ops)),
                )
            }
        };
        assert_eq!(
            a, b,
            "step {step}: operation {what} on {space:?} key {k:?} ({dbg})"
        );
    }
    pg.flush().unwrap();
}

#[test]
fn postgres_refuses_a_newer_schema() {
    let cluster = crate::testing::PgCluster::shared();
    let url = cluster.url("newer");
    drop(PgBackend::connect(&url).unwrap());
    // Twice is fine: migrations already applied are not applied again.
    drop(PgBackend::connect(&url).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c.batch_execute("UPDATE byom_schema SET version = version + 1")
            .await
            .unwrap();
    });
    let e = PgBackend::connect(&url)
        .err()
        .expect("a newer schema is refused");
    assert!(e.to_string().contains("newer than this byom"), "{e}");
}

#[test]
fn postgres_reconnects_after_the_database_drops_its_connections() {
    let cluster = crate::testing::PgCluster::shared();
    let url = cluster.url("reconnect");
    let pg = PgBackend::connect(&url).unwrap();
    pg.put(Space::Tokens, b"k", b"v").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c.batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = 'reconnect' AND pid <> pg_backend_pid()",
        )
        .await
        .unwrap();
    });
    // A call may fail on a connection found dead, not more than once each.
    let mut ok = 0;
    for _ in 0..(POOL_SIZE * 2 + 2) {
        if pg.get(Space::Tokens, b"k").ok().flatten().as_deref() == Some(&b"v"[..]) {
            ok += 1;
        }
    }
    assert!(
        ok >= POOL_SIZE + 2,
        "only {ok} reads succeeded after the reconnect"
    );
}

#[test]
fn postgres_notices_reach_every_process_sharing_the_store() {
    let cluster = crate::testing::PgCluster::shared();
    let url = cluster.url("notices");
    let a = PgBackend::connect(&url).unwrap();
    let b = PgBackend::connect(&url).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut heard = b.notices().unwrap();
        // The listener says `*` once it listens: from then on nothing is missed.
        let first = tokio::time::timeout(std::time::Duration::from_secs(10), heard.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first, "*");
        a.notify("wake mch_1").unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), heard.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, "wake mch_1");
    });
    assert!(a.is_shared());
}

#[test]
fn a_write_fenced_by_an_old_epoch_is_refused_on_both_backends() {
    both(|f| {
        let s = f.open();
        s.put_raw(Space::Leases, "epoch", b"1 a").unwrap();
        let guard = Guard {
            space: Space::Leases,
            key: b"epoch".to_vec(),
            value: b"1 a".to_vec(),
        };
        let op = |v: &str| [Op::put(Space::Agents, "r/x", v.as_bytes().to_vec())];
        assert!(s.batch_if(&guard, &op("first")).unwrap());
        // Another holder takes over: the epoch moves on.
        s.put_raw(Space::Leases, "epoch", b"2 b").unwrap();
        assert!(!s.batch_if(&guard, &op("late")).unwrap());
        assert_eq!(s.get_raw(Space::Agents, "r/x").unwrap().unwrap(), b"first");
    });
}

#[test]
fn an_unreachable_or_malformed_database_is_a_clear_error() {
    let e = PgBackend::connect("postgres://byom@127.0.0.1:1/byom")
        .err()
        .unwrap();
    assert!(e.to_string().contains("PostgreSQL"), "{e}");
    let e = PgBackend::connect("postgres://byom@127.0.0.1:1/byom?sslmode=nonsense")
        .err()
        .unwrap();
    assert!(e.to_string().contains("not a PostgreSQL URL"), "{e}");
}

#[test]
fn postgres_over_tls_checks_the_server_as_libpq_does() {
    let cluster = crate::testing::PgCluster::shared();
    cluster.url("tlsonly");
    let port = cluster.port();
    let ca = cluster.ca_file();
    let ca = ca.display();
    let at = |host: &str, q: &str| format!("postgres://byom@{host}:{port}/tlsonly?{q}");
    let fails = |url: String, says: &str| {
        let e = PgBackend::connect(&url).err().expect("refused").to_string();
        eprintln!("{url}: {e}");
        assert!(e.contains(says), "{url}: {e}");
    };
    // The CA and the name checked; `tlsonly` refuses plain connections,
    // so this one is encrypted.
    let pg = PgBackend::connect(&at(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .unwrap();
    pg.put(Space::Tokens, b"k", b"over TLS").unwrap();
    assert_eq!(pg.get(Space::Tokens, b"k").unwrap().unwrap(), b"over TLS");
    drop(pg);
    // The default (prefer) encrypts where the server offers it.
    PgBackend::connect(&at("127.0.0.1", "")).unwrap();
    PgBackend::connect(&at("127.0.0.1", "sslmode=require")).unwrap();
    fails(at("127.0.0.1", "sslmode=disable"), "rejects connection");
    // A local socket has no TLS, and needs none.
    let socket = cluster
        .socket_dir()
        .display()
        .to_string()
        .replace('/', "%2F");
    PgBackend::connect(&format!("postgres://byom@{socket}:{port}/tlsonly")).unwrap();
    PgBackend::connect(&format!(
        "postgres://byom@{socket}:{port}/tlsonly?sslmode=verify-full&sslrootcert={ca}"
    ))
    .unwrap();
    // The certificate names localhost, not the address: verify-full
    // refuses it, verify-ca (the CA only) takes it.
    fails(
        at(
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        "certificate",
    );
    PgBackend::connect(&at(
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .unwrap();
    // A CA that did not sign it: the public ones.
    fails(at("localhost", "sslrootcert=system"), "certificate");

    // A password login binds itself to this TLS session (SCRAM-PLUS):
    // `channel_binding=require` fails without it.
    cluster.admin(&format!(
        "CREATE ROLE scrammer LOGIN PASSWORD '{}'",
        crate::testing::SCRAM_PASSWORD
    ));
    cluster.admin("CREATE DATABASE scram OWNER scrammer");
    let url = format!(
        "postgres://scrammer:{}@localhost:{port}/scram?sslmode=verify-full&sslrootcert={ca}&channel_binding=require",
        crate::testing::SCRAM_PASSWORD
    );
    let pg = PgBackend::connect(&url).unwrap();
    pg.put(Space::Tokens, b"k", b"bound").unwrap();
    assert_eq!(pg.get(Space::Tokens, b"k").unwrap().unwrap(), b"bound");
    fails(url.replace("correct-horse", "wrong"), "password");
}
