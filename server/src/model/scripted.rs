//! The scripted stand-in ([`byom_agent::scripted::Scripted`]) as a model:
//! it answers at once and then waits as long as its latency model says a
//! provider would have taken.

use std::time::Duration;

use byom_agent::scripted::Scripted;

use super::{Model, ModelError, Request, Response};

pub struct ScriptedModel(pub Scripted);

#[async_trait::async_trait]
impl Model for ScriptedModel {
    async fn call(&self, req: &Request, timeout: Duration) -> Result<Response, ModelError> {
        let (resp, latency) = self.0.respond(req);
        if latency > timeout {
            tokio::time::sleep(timeout).await;
            return Err(ModelError::Transient(
                "scripted model timed out".into(),
                None,
            ));
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        Ok(resp)
    }
    fn name(&self) -> String {
        "scripted".into()
    }
}
