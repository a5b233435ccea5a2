//! The agent in a Matrix room, against a real Synapse on loopback: a person
//! posts as any client would (client-server API), the bot's replies land
//! in that room and thread; a `kill -9` of byom between the message and
//! the reply still gives exactly one reply; while the homeserver is down
//! replies wait in the outbox and go out when it returns.

use std::time::Duration;

use byom_tests::channels::{connect_github, enc, matrix_room, Synapse};
use byom_tests::{stdout, wait_for, Daemon, Server};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(90);

/// `who` (their ID and token) joins `room` on `inviter`'s invitation.
fn invite_and_join(syn: &Synapse, room: &str, inviter: &str, who: &str, token: &str) {
    let (st, v) = syn.api(
        "POST",
        &format!("/rooms/{}/invite", enc(room)),
        inviter,
        Some(json!({"user_id": who})),
    );
    assert_eq!(st, 200, "{v}");
    let (st, v) = syn.api(
        "POST",
        &format!("/join/{}", enc(room)),
        token,
        Some(json!({})),
    );
    assert_eq!(st, 200, "{v}");
}

/// byom's (`bot`'s) messages in `room` as `reader` sees them, newest first.
fn bot_messages(syn: &Synapse, room: &str, reader: &str, bot: &str) -> Vec<Value> {
    syn.messages(room, reader)
        .into_iter()
        .filter(|e| e["sender"] == bot)
        .collect()
}

/// Waits for byom to say something with `what` in it in `room`.
fn bot_says(syn: &Synapse, room: &str, reader: &str, bot: &str, what: &str) -> Value {
    wait_for(&format!("the bot to say {what:?}"), T, || {
        bot_messages(syn, room, reader, bot)
            .into_iter()
            .find(|e| e["content"]["body"].as_str().unwrap_or("").contains(what))
    })
}

struct Room {
    _dir: tempfile::TempDir,
    server: Server,
    _lap: Daemon,
    syn: Synapse,
    bot: String,
    ada: String,
    room: String,
}

fn setup() -> Room {
    let (dir, server, lap) = Server::with_lap(&[], &[]);
    // The room's people are the team (containment's own tests cover strangers).
    server.trust(&["add", "matrix:*"]);
    let syn = Synapse::start(dir.path());
    let m = matrix_room(&server, &syn, dir.path());
    Room {
        _dir: dir,
        server,
        _lap: lap,
        syn,
        bot: m.bot,
        ada: m.ada,
        room: m.room,
    }
}

impl Room {
    fn say(&self, content: Value) -> String {
        self.syn.send(&self.room, &self.ada, content)
    }

    fn text(&self, body: &str) -> String {
        self.say(json!({"msgtype": "m.text", "body": body}))
    }

    /// The bot's messages in the room, oldest first.
    fn bot_messages(&self) -> Vec<Value> {
        let mut v = bot_messages(&self.syn, &self.room, &self.ada, &self.bot);
        v.reverse();
        v
    }

    fn wait_bot(&self, what: &str) -> Value {
        wait_for(&format!("the bot to say {what:?}"), T, || {
            self.bot_messages()
                .into_iter()
                .find(|m| m["content"]["body"].as_str().unwrap_or("").contains(what))
        })
    }

    fn count_bot(&self, what: &str) -> usize {
        self.bot_messages()
            .iter()
            .filter(|m| m["content"]["body"].as_str().unwrap_or("").contains(what))
            .count()
    }

    fn trigger_stored(&self, text: &str) {
        wait_for(&format!("the trigger {text:?}"), T, || {
            let ls = self.server.json(&["events", "ls", "--limit", "200"]);
            ls.as_array()
                .unwrap()
                .iter()
                .any(|t| t["text"].as_str().unwrap_or("").contains(text) && t["user"] != "byom")
                .then_some(())
        });
    }
}

#[test]
fn a_person_asks_in_a_room_and_the_reply_lands_there() {
    let r = setup();
    let test = r.server.json(&["connectors", "test", "team"]);
    assert_eq!(test["ok"], true, "{test}");
    assert!(
        test["identity"].as_str().unwrap().contains(&r.bot),
        "{test}"
    );
    let ls = r.server.json(&["connectors", "ls"]);
    assert_eq!(ls[0]["kind"], "matrix", "{ls}");
    assert_eq!(ls[0]["has_token"], true, "{ls}");
    assert!(
        !ls.to_string().contains("syt_"),
        "secrets never come back: {ls}"
    );

    r.text("byom: please run `echo from-matrix` on lap");
    let done = r.wait_bot("from-matrix");
    assert!(done["content"]["formatted_body"].is_string(), "{done}");
    // Chat norms: short, no headings.
    assert!(
        !done["content"]["body"].as_str().unwrap().contains("###"),
        "{done}"
    );

    // A thread of its own: the reply goes into it.
    let root = r.text("release checklist");
    r.say(
        json!({"msgtype": "m.text", "body": "byom please run `echo in-thread` on lap",
                 "m.relates_to": {"rel_type": "m.thread", "event_id": root,
                                  "is_falling_back": true, "m.in_reply_to": {"event_id": root}}}),
    );
    let reply = r.wait_bot("in-thread");
    assert_eq!(
        reply["content"]["m.relates_to"]["rel_type"], "m.thread",
        "{reply}"
    );
    assert_eq!(
        reply["content"]["m.relates_to"]["event_id"],
        root.as_str(),
        "{reply}"
    );

    // Locality: a follow-up in the room reaches the worker with the
    // thread's earlier messages inlined.
    r.text("byom: now do the same with `echo other-one` on lap");
    r.wait_bot("other-one");
    let workers = r.server.json(&["workers", "ls"]);
    let transcripts: String = workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            r.server
                .json(&["workers", "show", w["id"].as_str().unwrap()])
                .to_string()
        })
        .collect();
    assert!(
        transcripts.contains("<context thread="),
        "no inlined context"
    );
    assert!(
        transcripts.contains("ada: byom: please run `echo from-matrix` on lap"),
        "the earlier message is inlined: {transcripts}"
    );

    // Every reply went out once, with the event ID as its receipt.
    let out = r.server.json(&["outbox", "ls"]);
    let items = out.as_array().unwrap();
    assert!(items.len() >= 4, "{out}");
    for it in items {
        assert_eq!(it["state"], "sent", "{it}");
        assert!(it["receipt"].as_str().unwrap().starts_with('$'), "{it}");
    }
    // Messages from the bot's own account are never triggers.
    let evs = r.server.json(&["events", "ls", "--limit", "200"]);
    assert!(
        !evs.as_array()
            .unwrap()
            .iter()
            .any(|t| t["user"] == format!("matrix:{}", r.bot).as_str()),
        "{evs}"
    );
}

#[test]
fn replies_survive_a_crash_and_a_homeserver_outage() {
    let mut r = setup();
    // kill -9 between the message and the reply: exactly one reply. The
    // homeserver is frozen so the reply may be mid-send when byom dies.
    r.text("byom: please run `echo crash-one` on lap");
    r.trigger_stored("crash-one");
    r.syn.freeze(true);
    std::thread::sleep(Duration::from_millis(300));
    r.server.kill9();
    r.syn.freeze(false);
    r.server.restart();
    r.wait_bot("`echo crash-one` on lap");
    // Anything still in flight has had time to land twice, if it could.
    wait_for("the outbox to empty", T, || {
        let out = r.server.json(&["outbox", "ls"]);
        out.as_array()
            .unwrap()
            .iter()
            .all(|it| it["state"] == "sent")
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        r.count_bot("`echo crash-one` on lap"),
        1,
        "{:?}",
        r.bot_messages()
    );
    assert_eq!(r.count_bot("On it"), 1, "{:?}", r.bot_messages());

    // The homeserver goes away before the reply is ready: it waits in the
    // outbox and goes out when the homeserver is back.
    r.text("byom: please run `sleep 4; echo outage-one` on lap");
    r.trigger_stored("outage-one");
    r.syn.stop();
    let waiting = wait_for("a reply waiting in the outbox", T, || {
        let out = r.server.json(&["outbox", "ls"]);
        out.as_array()
            .unwrap()
            .iter()
            .find(|it| {
                it["state"] == "pending"
                    && it["text"].as_str().unwrap_or("").contains("outage-one")
                    && it["attempts"].as_u64().unwrap_or(0) >= 1
            })
            .cloned()
    });
    assert!(
        !waiting["last_error"].as_str().unwrap().is_empty(),
        "{waiting}"
    );
    let id = waiting["id"].as_str().unwrap().to_string();
    let shown = r.server.byom(&["show", &id]);
    assert!(stdout(&shown).contains("pending"), "{}", stdout(&shown));
    r.syn.restart();
    r.wait_bot("outage-one");
    let it = wait_for("the item sent", T, || {
        let v = r.server.json(&["outbox", "show", &id]);
        (v["state"] == "sent").then_some(v)
    });
    assert!(it["receipt"].as_str().unwrap().starts_with('$'), "{it}");
    assert_eq!(r.count_bot("outage-one"), 1);
}

/// The story: asked in Matrix, the worker opens a PR (its command prints
/// the PR's link, as `gh pr create` does) and watches it; a review comment
/// on the PR reaches the same worker, and it answers in both places.
#[test]
fn a_pr_opened_from_chat_brings_its_review_back() {
    use byom_tests::channels::{post_hook, FakeApi};
    let r = setup();
    let gh = FakeApi::start(|req| {
        let id = 4000 + req.body.len();
        (201, vec![], json!({"id": id}).to_string())
    });
    let token = r._dir.path().join("gh.token");
    std::fs::write(&token, "ghp_x").unwrap();
    connect_github(
        &r.server,
        r._dir.path(),
        "gh",
        "s3cret",
        &gh.url(),
        "byom-bot",
        &["--token-file", token.to_str().unwrap()],
    );

    r.text(
        "byom: please fix the typo: run `echo opened https://github.com/acme/app/pull/7` on lap",
    );
    r.wait_bot("opened https://github.com/acme/app/pull/7");
    let task = wait_for("the worker watching the PR", T, || {
        let ts = r.server.json(&["tasks", "ls"]);
        ts.as_array()
            .unwrap()
            .iter()
            .find(|t| t["threads"].as_array().is_some_and(|th| th.len() == 2))
            .cloned()
    });
    let threads = r.server.json(&["threads", "ls"]);
    assert!(
        threads
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["external"] == "acme/app#7" && t["source"] == "gh"),
        "{threads}"
    );

    // A reviewer comments on the PR (GitHub's payload shape).
    let review = json!({"action": "created", "repository": {"full_name": "acme/app"},
        "pull_request": {"number": 7, "title": "Fix typo"},
        "comment": {"id": 9001, "path": "README.md", "body": "please also run `echo review-fixed` on lap",
                    "html_url": "https://github.com/acme/app/pull/7#discussion_r9001",
                    "user": {"login": "reviewer", "type": "User"}, "author_association": "MEMBER"},
        "sender": {"login": "reviewer", "type": "User"}})
    .to_string();
    let sig = byom_tests::webhook_sign(b"s3cret", &review);
    let (st, v) = post_hook(
        r.server.webhook_addr,
        "/github/gh",
        &[
            ("X-GitHub-Event", "pull_request_review_comment"),
            ("X-GitHub-Delivery", "rv1"),
            ("X-Hub-Signature-256", &sig),
        ],
        &review,
    );
    assert_eq!(st, 202, "{v}");
    // Answered in both places, by the same worker.
    r.wait_bot("review-fixed");
    wait_for("the answer on the PR", T, || {
        gh.requests().into_iter().find(|q| {
            q.path == "/repos/acme/app/issues/7/comments" && q.body.contains("review-fixed")
        })
    });
    let w = r
        .server
        .json(&["workers", "show", task["id"].as_str().unwrap()])
        .to_string();
    assert!(
        w.contains("echo review-fixed"),
        "the review reached the worker that opened the PR"
    );
    let tasks = r.server.json(&["tasks", "ls"]);
    assert_eq!(
        tasks.as_array().unwrap().len(),
        1,
        "no second task: {tasks}"
    );
}

/// `who` reacts with `key` to `event` in `room`.
fn react(syn: &Synapse, room: &str, who: &str, event: &str, key: &str) {
    let txn = format!("r{}", event.len() + key.len() + who.len());
    let (st, v) = syn.api(
        "PUT",
        &format!("/rooms/{}/send/m.reaction/{txn}{}", enc(room), enc(key)),
        who,
        Some(json!({"m.relates_to": {"rel_type": "m.annotation", "event_id": event, "key": key}})),
    );
    assert_eq!(st, 200, "{v}");
}

/// An approver answers byom's request with a reaction: a stranger's ✅ is
/// refused, the approver's ✅ runs exactly the command the request shows
/// and, on the laptop's output the stranger would read, a second ✅ posts
/// it.
#[test]
fn an_approver_answers_with_a_reaction() {
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    let syn = Synapse::start(dir.path());
    let m = matrix_room(&server, &syn, dir.path());
    server.trust(&["approvers", "add", &format!("matrix:{}", m.ada_id)]);
    // bob, on the same homeserver, is nobody the server trusts.
    let (bob_id, bob) = syn.register("bob");
    invite_and_join(&syn, &m.room, &m.ada, &bob_id, &bob);
    syn.send(
        &m.room,
        &bob,
        json!({"msgtype": "m.text", "body": "byom: please run `echo by-reaction` on lap"}),
    );
    let bot = |what: &str| bot_says(&syn, &m.room, &m.ada, &m.bot, what);
    let ask = bot("echo by-reaction");
    let body = ask["content"]["body"].as_str().unwrap().to_string();
    assert!(body.contains("Approval needed"), "{body}");
    let ask_id = ask["event_id"].as_str().unwrap().to_string();
    react(&syn, &m.room, &bob, &ask_id, "✅");
    bot("may not approve");
    let ran = || {
        server
            .json(&["commands", "ls"])
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["shell"] == "echo by-reaction")
    };
    assert!(!ran(), "a stranger's reaction runs nothing");
    react(&syn, &m.room, &m.ada, &ask_id, "✅\u{fe0f}");
    wait_for("the approved command", T, || ran().then_some(()));
    let post = bot("characters");
    assert!(
        !post["content"]["body"]
            .as_str()
            .unwrap()
            .contains("by-reaction\n"),
        "{post}"
    );
    react(
        &syn,
        &m.room,
        &m.ada,
        post["event_id"].as_str().unwrap(),
        "👍",
    );
    wait_for("the result in the room", T, || {
        bot_messages(&syn, &m.room, &m.ada, &m.bot)
            .into_iter()
            .map(|e| e["content"]["body"].as_str().unwrap_or("").to_string())
            .find(|b| {
                b.contains("by-reaction")
                    && !b.contains("Approval needed")
                    && !b.contains("Approved by")
            })
    });
}

/// An approver may answer in a direct room with the bot (made with
/// `is_direct`, as Matrix clients make DMs): `approve CODE` there approves
/// the request asked in the team's room, which hears so.
#[test]
fn an_approver_answers_in_a_direct_room() {
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    let syn = Synapse::start(dir.path());
    let m = matrix_room(&server, &syn, dir.path());
    server.trust(&["approvers", "add", &format!("matrix:{}", m.ada_id)]);
    let (st, v) = syn.api(
        "POST",
        "/createRoom",
        &m.ada,
        Some(json!({"is_direct": true, "invite": [m.bot], "preset": "trusted_private_chat"})),
    );
    assert_eq!(st, 200, "{v}");
    let dm = v["room_id"].as_str().unwrap().to_string();
    wait_for("the bot to join the direct room", T, || {
        let (_, v) = syn.api(
            "GET",
            &format!("/rooms/{}/joined_members", enc(&dm)),
            &m.ada,
            None,
        );
        v["joined"].get(&m.bot).map(|_| ())
    });
    // A stranger asks in the team's room (as in the reaction test).
    let (bob_id, bob) = syn.register("bob");
    invite_and_join(&syn, &m.room, &m.ada, &bob_id, &bob);
    syn.send(
        &m.room,
        &bob,
        json!({"msgtype": "m.text", "body": "byom: please run `echo by-dm` on lap"}),
    );
    let said = |room: &str, what: &str| bot_says(&syn, room, &m.ada, &m.bot, what);
    let ask = said(&m.room, "echo by-dm");
    let code = server
        .json(&["approvals", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a["code"].as_str().map(str::to_string))
        .unwrap();
    assert!(ask["content"]["body"].as_str().unwrap().contains(&code));
    syn.send(
        &dm,
        &m.ada,
        json!({"msgtype": "m.text", "body": format!("approve {code}")}),
    );
    said(&dm, "Approved by");
    said(&m.room, "answered in a direct message");
    wait_for("the approved command", T, || {
        server
            .json(&["commands", "ls"])
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["shell"] == "echo by-dm")
            .then_some(())
    });
}

/// A public room is read by anyone who joins, whoever has spoken: the
/// laptop's output, asked for by a trusted member, waits for a yes there
/// and the request does not show it.
#[test]
fn a_public_room_does_not_get_the_laptop_output_unasked() {
    let r = setup();
    let (st, v) = r.syn.api(
        "PUT",
        &format!("/rooms/{}/state/m.room.join_rules/", enc(&r.room)),
        &r.ada,
        Some(json!({"join_rule": "public"})),
    );
    assert_eq!(st, 200, "{v}");
    r.text("byom: please run `echo in-public` on lap");
    let ask = r.wait_bot("characters");
    let body = ask["content"]["body"].as_str().unwrap();
    assert!(body.contains("Approval needed"), "{body}");
    assert!(!body.contains("in-public"), "{body}");
    assert_eq!(r.count_bot("Done"), 0, "the output was not posted");
}

/// A room is read by everyone in it, not only by those who spoke: with a
/// member the server does not trust (who never says a word), a trusted
/// member's laptop output waits for a yes; once that member has left, the
/// next output is posted.
#[test]
fn a_silent_stranger_in_the_room_keeps_the_laptop_output_back() {
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    let syn = Synapse::start(dir.path());
    let m = matrix_room(&server, &syn, dir.path());
    server.trust(&["add", &format!("matrix:{}", m.ada_id)]);
    let (eve_id, eve) = syn.register("eve");
    invite_and_join(&syn, &m.room, &m.ada, &eve_id, &eve);
    let bot = |what: &str| bot_says(&syn, &m.room, &m.ada, &m.bot, what);
    syn.send(
        &m.room,
        &m.ada,
        json!({"msgtype": "m.text", "body": "byom: please run `echo with-eve-here` on lap"}),
    );
    let ask = bot("characters");
    let body = ask["content"]["body"].as_str().unwrap().to_string();
    assert!(body.contains("Approval needed"), "{body}");
    assert!(body.contains(&eve_id), "says who reads it: {body}");
    assert!(!body.contains("with-eve-here\n"), "{body}");
    let (st, v) = syn.api(
        "POST",
        &format!("/rooms/{}/leave", enc(&m.room)),
        &eve,
        Some(json!({})),
    );
    assert_eq!(st, 200, "{v}");
    // The bot learns of the leave as it syncs; until then a post is held.
    std::thread::sleep(Duration::from_secs(2));
    syn.send(
        &m.room,
        &m.ada,
        json!({"msgtype": "m.text", "body": "byom: please run `echo only-us` on lap"}),
    );
    bot("only-us");
    let held = bot_messages(&syn, &m.room, &m.ada, &m.bot)
        .into_iter()
        .filter(|e| {
            e["content"]["body"]
                .as_str()
                .unwrap_or("")
                .contains("Approval needed")
        })
        .count();
    assert_eq!(held, 1, "only the first output waited");
}

/// A stranger who joins while byom is not syncing, followed by more
/// messages than one sync's timeline holds, is hidden from the next sync
/// (its timeline is cut, and lazy-loaded members name only those who
/// spoke in what is shown): byom asks who reads the room again after a
/// cut timeline, so the silent stranger still keeps the output back.
#[test]
fn a_stranger_hidden_by_a_cut_timeline_still_keeps_the_output_back() {
    let (dir, mut server, _lap) = Server::with_lap(&[], &[]);
    let syn = Synapse::start(dir.path());
    let m = matrix_room(&server, &syn, dir.path());
    server.trust(&["add", &format!("matrix:{}", m.ada_id)]);
    let bot = |what: &str| bot_says(&syn, &m.room, &m.ada, &m.bot, what);
    // Only Ada reads the room: her output is posted.
    syn.send(
        &m.room,
        &m.ada,
        json!({"msgtype": "m.text", "body": "byom: please run `echo before-gap` on lap"}),
    );
    bot("Done");
    server.kill9();
    let (eve_id, eve) = syn.register("eve");
    invite_and_join(&syn, &m.room, &m.ada, &eve_id, &eve);
    // More than a sync's timeline (50) after Eve's join.
    for i in 0..60 {
        syn.send(
            &m.room,
            &m.ada,
            json!({"msgtype": "m.text", "body": format!("just chatting {i}")}),
        );
    }
    server.restart();
    // The request comes after the chatter has been read (a request in the
    // same batch as 60 lines of chatter is not what this test is about).
    wait_for("the chatter read", T, || {
        server
            .json(&["events", "ls", "--limit", "200"])
            .as_array()?
            .iter()
            .any(|t| t["text"] == "just chatting 59")
            .then_some(())
    });
    syn.send(
        &m.room,
        &m.ada,
        json!({"msgtype": "m.text", "body": "byom: please run `echo after-gap` on lap"}),
    );
    let ask = bot("characters");
    let body = ask["content"]["body"].as_str().unwrap().to_string();
    assert!(body.contains("Approval needed"), "{body}");
    assert!(body.contains(&eve_id), "says who reads it: {body}");
    assert!(!body.contains("after-gap\n"), "{body}");
}

/// A room whose history is world readable is read by anyone, member or
/// not, without a membership event to tell byom: a trusted member's
/// laptop output waits for a yes there. (Eve, never in the room, reads
/// what is posted in it.)
#[test]
fn a_world_readable_room_does_not_get_the_laptop_output_unasked() {
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    let syn = Synapse::start(dir.path());
    let m = matrix_room(&server, &syn, dir.path());
    server.trust(&["add", &format!("matrix:{}", m.ada_id)]);
    let (st, v) = syn.api(
        "PUT",
        &format!("/rooms/{}/state/m.room.history_visibility/", enc(&m.room)),
        &m.ada,
        Some(json!({"history_visibility": "world_readable"})),
    );
    assert_eq!(st, 200, "{v}");
    let (_eve_id, eve) = syn.register("eve");
    syn.send(
        &m.room,
        &m.ada,
        json!({"msgtype": "m.text", "body": "byom: please run `echo world-sees` on lap"}),
    );
    // Eve reads the room without ever joining it.
    let seen = wait_for("the bot's answer, read by Eve", T, || {
        let (st, v) = syn.api(
            "GET",
            &format!("/rooms/{}/messages?dir=b&limit=50", enc(&m.room)),
            &eve,
            None,
        );
        assert_eq!(st, 200, "a world-readable room is read by anyone: {v}");
        v["chunk"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["sender"] == m.bot.as_str())
            .find_map(|e| {
                let body = e["content"]["body"].as_str().unwrap_or("");
                (body.contains("characters") || body.contains("Done")).then(|| body.to_string())
            })
    });
    assert!(seen.contains("Approval needed"), "{seen}");
    assert!(!seen.contains("world-sees\n"), "{seen}");

    // History for members only, but anyone in another room may join
    // without an invitation: that room's people read it too.
    let (st, v) = syn.api(
        "POST",
        "/createRoom",
        &eve,
        Some(json!({"name": "lobby", "preset": "public_chat"})),
    );
    assert_eq!(st, 200, "{v}");
    let lobby = v["room_id"].as_str().unwrap().to_string();
    for (kind, content) in [
        (
            "m.room.history_visibility",
            json!({"history_visibility": "shared"}),
        ),
        (
            "m.room.join_rules",
            json!({"join_rule": "restricted",
                   "allow": [{"type": "m.room_membership", "room_id": lobby}]}),
        ),
    ] {
        let (st, v) = syn.api(
            "PUT",
            &format!("/rooms/{}/state/{kind}/", enc(&m.room)),
            &m.ada,
            Some(content),
        );
        assert_eq!(st, 200, "{v}");
    }
    syn.send(
        &m.room,
        &m.ada,
        json!({"msgtype": "m.text", "body": "byom: please run `echo lobby-sees` on lap"}),
    );
    let held = wait_for("the second request", T, || {
        bot_messages(&syn, &m.room, &m.ada, &m.bot)
            .into_iter()
            .find_map(|e| {
                let body = e["content"]["body"].as_str().unwrap_or("");
                (body.contains("lobby-sees")
                    || (body.contains("characters") && body.contains("restricted")))
                .then(|| body.to_string())
            })
    });
    assert!(held.contains("Approval needed"), "{held}");
    assert!(!held.contains("lobby-sees\n"), "{held}");
}

/// `is_direct` is the inviter's word, and a room stays the room it was:
/// once someone else is in a room made as direct, it is no longer a
/// direct conversation between an approver and byom, and an `approve
/// CODE` there (perhaps asked for by the other person, who also reads it)
/// answers only requests asked in it.
#[test]
fn a_direct_room_with_someone_else_in_it_is_not_direct() {
    let (dir, server, _lap) = Server::with_lap(&[], &[]);
    let syn = Synapse::start(dir.path());
    let m = matrix_room(&server, &syn, dir.path());
    server.trust(&["approvers", "add", &format!("matrix:{}", m.ada_id)]);
    let (mal_id, mal) = syn.register("mallory");
    let (st, v) = syn.api(
        "POST",
        "/createRoom",
        &m.ada,
        Some(
            json!({"is_direct": true, "invite": [m.bot, mal_id], "preset": "trusted_private_chat"}),
        ),
    );
    assert_eq!(st, 200, "{v}");
    let dm = v["room_id"].as_str().unwrap().to_string();
    let (st, v) = syn.api(
        "POST",
        &format!("/join/{}", enc(&dm)),
        &mal,
        Some(json!({})),
    );
    assert_eq!(st, 200, "{v}");
    wait_for("the bot to join the room", T, || {
        let (_, v) = syn.api(
            "GET",
            &format!("/rooms/{}/joined_members", enc(&dm)),
            &m.ada,
            None,
        );
        v["joined"].get(&m.bot).map(|_| ())
    });
    // Mallory asks in the team's room.
    invite_and_join(&syn, &m.room, &m.ada, &mal_id, &mal);
    syn.send(
        &m.room,
        &mal,
        json!({"msgtype": "m.text", "body": "byom: please run `echo not-by-dm` on lap"}),
    );
    let said = |room: &str, what: &str| bot_says(&syn, room, &m.ada, &m.bot, what);
    said(&m.room, "echo not-by-dm");
    let code = server
        .json(&["approvals", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a["code"].as_str().map(str::to_string))
        .unwrap();
    syn.send(
        &dm,
        &m.ada,
        json!({"msgtype": "m.text", "body": format!("approve {code}")}),
    );
    said(&dm, "was not asked on this thread");
    let open = server.json(&["approvals", "ls"]);
    assert!(
        open.as_array()
            .unwrap()
            .iter()
            .any(|a| a["code"] == code.as_str() && a["state"] == "open"),
        "{open}"
    );
    assert!(!server
        .json(&["commands", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["shell"] == "echo not-by-dm"));
}
