//! What a decision can see, kept current: the object model of
//! `runbook_core::observe`, and here the watch caches that fill it, the
//! views over them, the indexes, discovery and watch health.

pub mod cache;
pub mod discovery;
pub mod health;
pub mod index;
pub mod merge;
pub mod schemas;
pub mod view;
