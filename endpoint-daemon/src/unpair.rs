//! `byomd unpair`: deregister from the server, or learn that the server
//! already let this machine go (revoked it, or never heard of its
//! certificate), in which case wiping the local identity is all that is
//! left to do. `byomd status` recommends unpairing a revoked machine, so
//! that must work without `--force`.

use std::path::Path;

use crate::identity::Identity;

/// How unpairing went on the server's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unpaired {
    /// The server forgot the machine at our request.
    Deregistered,
    /// The server had already let it go; why, in a few words.
    AlreadyGone(String),
}

/// Asks the server to forget this machine. A machine the server revoked
/// (as it told the running daemon earlier, or tells us now) or does not
/// know is already gone there: that is not an error.
pub async fn deregister(dir: &Path, id: &Identity) -> anyhow::Result<Unpaired> {
    if id.revoked {
        // The server said so to the running daemon, and refuses this
        // certificate from then on: asking again cannot succeed.
        return Ok(Unpaired::AlreadyGone(
            "the server had already revoked this machine".into(),
        ));
    }
    match crate::conn::unpair(dir, id).await {
        Ok(()) => Ok(Unpaired::Deregistered),
        Err(e) => match e.chain().find_map(|c| c.downcast_ref()).and_then(gone) {
            Some(why) => Ok(Unpaired::AlreadyGone(why)),
            None => Err(e),
        },
    }
}

/// Whether a connection's end says the server is done with this machine,
/// and how to say it: what ends a running daemon's connection for good
/// (its close codes, a revoked certificate's alert), and also the alert
/// for a certificate its CA did not issue (48, a server whose data was
/// reset), which a running daemon retries but unpairing need not.
fn gone(e: &quinn::ConnectionError) -> Option<String> {
    crate::conn::closed_for_good(e).or_else(|| match e {
        quinn::ConnectionError::ConnectionClosed(c)
            if c.error_code == quinn::TransportErrorCode::crypto(48) =>
        {
            Some("the server does not recognise this machine's certificate (its CA did not issue it)".into())
        }
        _ => None,
    })
}
