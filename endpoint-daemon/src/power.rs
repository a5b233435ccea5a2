//! The machine going to sleep and waking, as the OS tells it, so the
//! server can show a laptop asleep rather than gone, and the daemon can
//! reconnect the moment it wakes rather than when its heartbeat notices.
//! - Linux: logind's `PrepareForSleep` signal on the system bus (true
//!   before a suspend, false after the resume).
//! - Everywhere on Linux: the boot clock running ahead of the monotonic
//!   one, which stops while suspended, says a sleep happened even when no
//!   signal came (no logind, a daemon that was stopped).
//!
//! macOS's power notifications are not read yet: there the clock jump
//! alone says the machine slept.

use std::sync::OnceLock;

use tokio::sync::watch;

/// A jump of the boot clock past the monotonic one beyond this is a sleep.
pub const SLEPT_AFTER_MS: u64 = 5_000;

static SLEEPING: OnceLock<watch::Sender<bool>> = OnceLock::new();

/// Whether the OS said the machine is about to sleep (true) or is awake
/// again (false), from now on. The first call starts listening.
pub fn subscribe() -> watch::Receiver<bool> {
    SLEEPING
        .get_or_init(|| {
            let (tx, _) = watch::channel(false);
            #[cfg(target_os = "linux")]
            {
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Err(e) = logind(tx).await {
                        tracing::info!("no sleep notifications from logind ({e}): a wake is seen by the clock alone");
                    }
                });
            }
            tx
        })
        .subscribe()
}

#[cfg(target_os = "linux")]
async fn logind(tx: watch::Sender<bool>) -> anyhow::Result<()> {
    use futures_util::StreamExt;
    let conn = zbus::Connection::system().await?;
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .path("/org/freedesktop/login1")?
        .interface("org.freedesktop.login1.Manager")?
        .member("PrepareForSleep")?
        .build();
    let mut stream = zbus::MessageStream::for_match_rule(rule, &conn, Some(16)).await?;
    tracing::debug!("listening for logind's sleep notifications");
    while let Some(msg) = stream.next().await {
        let Ok(msg) = msg else { continue };
        let Ok(going) = msg.body().deserialize::<bool>() else {
            continue;
        };
        tracing::info!(
            "{}",
            if going {
                "the machine is going to sleep"
            } else {
                "the machine woke up"
            }
        );
        tx.send_replace(going);
    }
    Ok(())
}

/// Milliseconds this machine has spent suspended since it booted (the
/// boot clock minus the monotonic one); 0 where that is not known.
pub fn suspended_ms() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let read = |clock| {
            let mut t = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime fills a timespec.
            if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
                return None;
            }
            Some(t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000)
        };
        if let (Some(boot), Some(mono)) = (read(libc::CLOCK_BOOTTIME), read(libc::CLOCK_MONOTONIC))
        {
            return boot.saturating_sub(mono);
        }
    }
    0
}
