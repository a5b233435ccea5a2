//! The policy suite again, every server on PostgreSQL: test binaries named
//! `*_pg` run their servers on a private cluster (see
//! `byom_tests::test_store_is_postgres`).

#[path = "policy.rs"]
mod suite;
