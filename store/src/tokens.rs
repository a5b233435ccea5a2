//! Pairing tokens: stored by ID with an index from the secret's hash (the
//! secret itself is never stored); redemption is a compare-and-swap, so of
//! any number of concurrent redemptions exactly one wins.

use byom_protocol::pb;
use prost::Message;

use crate::backend::{Op, Space};
use crate::{decode, RedeemError, Result, Store, MAX_LIST};

impl Store {
    /// The token and its secret's index appear together (a crash between
    /// two writes would leave an index to nothing).
    pub fn create_token(&self, token: &pb::Token, extra: &[Op]) -> Result<()> {
        let mut ops = vec![
            Op::put(Space::Tokens, token.id.as_bytes(), token.encode_to_vec()),
            Op::put(
                Space::TokenSecrets,
                token.secret_sha256.as_bytes(),
                token.id.as_bytes().to_vec(),
            ),
        ];
        ops.extend_from_slice(extra);
        self.kv.batch(&ops)
    }

    pub fn get_token_by_secret(&self, secret_sha256: &str) -> Result<Option<pb::Token>> {
        match self.kv.get(Space::TokenSecrets, secret_sha256.as_bytes())? {
            Some(id) => self.get_token(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    pub fn get_token(&self, id: &str) -> Result<Option<pb::Token>> {
        self.get_msg(Space::Tokens, id)
    }

    pub fn list_tokens(&self) -> Result<Vec<pb::Token>> {
        self.list_msgs(Space::Tokens, MAX_LIST)
    }

    pub fn revoke_token(&self, id: &str) -> Result<pb::Token> {
        self.update_msg(Space::Tokens, id, |t: &mut pb::Token| {
            t.revoked = true;
            Ok(())
        })
    }

    /// Marks the token with this secret hash used by `machine_id`, atomically:
    /// of any number of concurrent redemptions exactly one succeeds.
    pub fn redeem_token(
        &self,
        secret_sha256: &str,
        machine_id: &str,
        now_ms: u64,
    ) -> Result<std::result::Result<pb::Token, RedeemError>> {
        let Some(id) = self.kv.get(Space::TokenSecrets, secret_sha256.as_bytes())? else {
            return Ok(Err(RedeemError::Unknown));
        };
        let id = String::from_utf8_lossy(&id).into_owned();
        // A reusable token's count races other pairings: each use is a
        // compare-and-swap of the record, tried again on a lost race, so
        // no two pairings take the same use and none is lost.
        for _ in 0..REDEEM_TRIES {
            let Some(old) = self.kv.get(Space::Tokens, id.as_bytes())? else {
                return Ok(Err(RedeemError::Unknown));
            };
            let mut token: pb::Token = decode(&id, &old)?;
            if token.revoked {
                return Ok(Err(RedeemError::Revoked));
            }
            if now_ms >= token.expires_at_ms {
                return Ok(Err(RedeemError::Expired));
            }
            if token.reusable {
                if token.max_uses != 0 && token.uses >= token.max_uses {
                    return Ok(Err(RedeemError::UsedUp(token.max_uses)));
                }
                token.uses += 1;
            } else if token.used_at_ms != 0 {
                return Ok(Err(RedeemError::Used));
            }
            token.used_at_ms = now_ms;
            token.used_by = machine_id.to_string();
            let swapped = self.kv.compare_and_swap(
                Space::Tokens,
                id.as_bytes(),
                Some(&old),
                Some(&token.encode_to_vec()),
            )?;
            if swapped {
                return Ok(Ok(token));
            }
            if !token.reusable {
                // Someone else changed it first: used or revoked, either
                // way not ours.
                return Ok(Err(RedeemError::Used));
            }
        }
        Ok(Err(RedeemError::Busy))
    }
}

/// Compare-and-swap rounds a reusable token's use may lose to others
/// before the pairing is refused (try again).
const REDEEM_TRIES: usize = 64;
