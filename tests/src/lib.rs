//! Support for the integration tests: an isolated database per test on real
//! PostgreSQL, MariaDB and SQLite, and the entities and events the tests save.
//!
//! The servers are the ones every development machine and CI run: PostgreSQL
//! at `postgres://postgres@127.0.0.1:5432/test` and MariaDB at
//! `mysql://root@127.0.0.1:3306/test`, overridable with
//! `OUTBOX_TEST_POSTGRES_URL` and `OUTBOX_TEST_MYSQL_URL`. A missing server
//! fails the test with the URL it tried; nothing is skipped.

pub mod db;
pub mod entities;
pub mod events;
pub mod http;
pub mod kafka;
pub mod nats;
pub mod process;
pub mod rabbitmq;
pub mod stream;
pub mod tls;
pub mod wait;
pub mod witness;

pub use db::{Backend, OutboxRow, TestDb};

/// Instantiates `async fn name(backend: Backend)` once per backend, as
/// `postgres::name`, `mariadb::name` and `sqlite::name`.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::Backend::Postgres).await
                }
            )*
        }
        mod mariadb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::Backend::MySql).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::Backend::Sqlite).await
                }
            )*
        }
    };
}
