//! Model providers against real HTTP servers on loopback that speak each
//! provider's API: tool calls both ways, usage (incl. cache reads), errors,
//! retries with backoff and retry-after, timeouts.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use byom_agent::llm::{Message, Tool};

use crate::model::{self, Anthropic, Model, ModelError, OpenAi, Request, RetryPolicy, ToolCall};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// (status, body, retry-after seconds, delay before answering)
type Scripted = (u16, Value, Option<u64>, Duration);
/// (path, headers, JSON body) of a request the fake API received.
type Seen = (String, Vec<(String, String)>, Value);

#[derive(Clone, Default)]
struct FakeApi {
    replies: Arc<Mutex<VecDeque<Scripted>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeApi {
    fn push(&self, status: u16, body: Value) {
        self.replies
            .lock()
            .unwrap()
            .push_back((status, body, None, Duration::ZERO));
    }
    fn push_full(&self, s: Scripted) {
        self.replies.lock().unwrap().push_back(s);
    }
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let me = me.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let me = me.clone();
                            async move {
                                let path = req.uri().path().to_string();
                                let headers = req
                                    .headers()
                                    .iter()
                                    .map(|(k, v)| {
                                        (k.to_string(), v.to_str().unwrap_or("").to_string())
                                    })
                                    .collect();
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let body: Value =
                                    serde_json::from_slice(&body).unwrap_or(Value::Null);
                                me.seen.lock().unwrap().push((path, headers, body));
                                let next = me.replies.lock().unwrap().pop_front();
                                let (status, reply, retry, delay) = next.unwrap_or((
                                    500,
                                    json!({"error": "no scripted reply"}),
                                    None,
                                    Duration::ZERO,
                                ));
                                tokio::time::sleep(delay).await;
                                let mut resp = hyper::Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json");
                                if let Some(r) = retry {
                                    resp = resp.header("retry-after", r.to_string());
                                }
                                Ok::<_, Infallible>(
                                    resp.body(Full::new(Bytes::from(reply.to_string())))
                                        .unwrap(),
                                )
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        format!("http://{addr}")
    }
}

fn request() -> Request {
    Request {
        system: "You are the router.".into(),
        messages: vec![
            Message::user("run uname on lap"),
            Message::assistant(
                "",
                vec![ToolCall {
                    id: "call_1".into(),
                    name: "shell_start".into(),
                    arguments: json!({"machine": "lap", "command": "uname"}),
                }],
            ),
            Message::tool_result("call_1", "Linux"),
        ],
        tools: vec![Tool {
            name: "reply".into(),
            description: "Reply on the thread".into(),
            parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        }],
        max_tokens: 256,
    }
}

fn fast() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(200),
        timeout: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn openai_chat_completions_round_trip_with_tools_and_usage() {
    let api = FakeApi::default();
    let base = api.start().await;
    api.push(
        200,
        json!({"id": "x", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_2", "type": "function", "function": {"name": "reply", "arguments": "{\"text\":\"Linux\"}"}}]}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 96}}}),
    );
    let m = OpenAi {
        base_url: format!("{base}/v1"),
        model: "gpt-test".into(),
        api_key: Some("sk-test".into()),
    };
    let r = model::complete(&m, &request(), &fast()).await.unwrap();
    assert_eq!(
        r.tool_calls,
        vec![ToolCall {
            id: "call_2".into(),
            name: "reply".into(),
            arguments: json!({"text": "Linux"})
        }]
    );
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cache_read_tokens
        ),
        (120, 9, 96)
    );
    assert_eq!(r.stop_reason, "tool_calls");
    let seen = api.seen.lock().unwrap();
    let (path, headers, body) = &seen[0];
    assert_eq!(path, "/v1/chat/completions");
    assert!(headers
        .iter()
        .any(|(k, v)| k == "authorization" && v == "Bearer sk-test"));
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "You are the router."})
    );
    assert_eq!(
        body["messages"][2]["tool_calls"][0]["function"]["arguments"],
        "{\"command\":\"uname\",\"machine\":\"lap\"}"
    );
    assert_eq!(
        body["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "Linux"})
    );
    assert_eq!(body["tools"][0]["function"]["name"], "reply");
}

#[tokio::test]
async fn anthropic_messages_round_trip_with_tools_and_cache_usage() {
    let api = FakeApi::default();
    let base = api.start().await;
    api.push(
        200,
        json!({"id": "msg_1", "type": "message", "role": "assistant", "stop_reason": "tool_use",
            "content": [{"type": "text", "text": "On it."}, {"type": "tool_use", "id": "toolu_1", "name": "reply", "input": {"text": "Linux"}}],
            "usage": {"input_tokens": 20, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 0, "output_tokens": 12}}),
    );
    let m = Anthropic {
        base_url: base,
        model: "claude-test".into(),
        api_key: "ak-test".into(),
    };
    let r = model::complete(&m, &request(), &fast()).await.unwrap();
    assert_eq!(r.text, "On it.");
    assert_eq!(r.tool_calls[0].arguments, json!({"text": "Linux"}));
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cache_read_tokens
        ),
        (120, 12, 100)
    );
    let seen = api.seen.lock().unwrap();
    let (path, headers, body) = &seen[0];
    assert_eq!(path, "/v1/messages");
    assert!(headers
        .iter()
        .any(|(k, v)| k == "x-api-key" && v == "ak-test"));
    assert!(headers
        .iter()
        .any(|(k, v)| k == "anthropic-version" && v == "2023-06-01"));
    assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral");
    assert_eq!(body["messages"][1]["content"][0]["type"], "tool_use");
    assert_eq!(
        body["messages"][2],
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "Linux"}]})
    );
    assert_eq!(body["tools"][0]["input_schema"]["type"], "object");
}

#[tokio::test]
async fn retries_on_429_and_5xx_then_succeeds_and_gives_up_when_bounded() {
    let api = FakeApi::default();
    let base = api.start().await;
    let ok = json!({"choices": [{"finish_reason": "stop", "message": {"content": "hi"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}});
    api.push_full((429, json!({"error": "slow down"}), Some(0), Duration::ZERO));
    api.push(503, json!({"error": "overloaded"}));
    api.push(200, ok.clone());
    let m = OpenAi {
        base_url: base.clone(),
        model: "m".into(),
        api_key: None,
    };
    let r = model::complete(&m, &request(), &fast()).await.unwrap();
    assert_eq!((r.text.as_str(), r.attempts), ("hi", 3));

    for _ in 0..3 {
        api.push(500, json!({"error": "down"}));
    }
    let e = model::complete(&m, &request(), &fast()).await.unwrap_err();
    assert!(matches!(e, ModelError::GaveUp { attempts: 3, .. }), "{e}");

    // A bad request is not retried.
    api.push(400, json!({"error": {"message": "bad tool schema"}}));
    api.push(200, ok.clone());
    let e = model::complete(&m, &request(), &fast()).await.unwrap_err();
    assert!(
        matches!(&e, ModelError::Permanent(msg) if msg.contains("bad tool schema")),
        "{e}"
    );
    let _ = model::complete(&m, &request(), &fast()).await.unwrap();

    // A slow provider times out and is retried.
    api.push_full((200, ok.clone(), None, Duration::from_secs(3)));
    api.push(200, ok);
    let policy = RetryPolicy {
        timeout: Duration::from_millis(300),
        ..fast()
    };
    let t = Instant::now();
    let r = model::complete(&m, &request(), &policy).await.unwrap();
    assert_eq!(r.attempts, 2);
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn unreachable_provider_is_transient_and_bounded() {
    let m = OpenAi {
        base_url: "http://127.0.0.1:9".into(),
        model: "m".into(),
        api_key: None,
    };
    let e = model::complete(&m, &request(), &fast()).await.unwrap_err();
    assert!(matches!(e, ModelError::GaveUp { .. }), "{e}");
    let bad = OpenAi {
        base_url: "ftp://x".into(),
        model: "m".into(),
        api_key: None,
    };
    assert!(matches!(
        model::complete(&bad, &request(), &fast())
            .await
            .unwrap_err(),
        ModelError::Permanent(_)
    ));
    let _ = m.name();
}
