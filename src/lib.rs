pub mod actors;
pub mod ai;
pub mod clock;
pub mod config;
pub mod domain;
pub mod http;
pub mod startup;
pub mod store;
