//! What every HTTP handler of a service gets: its pool, its outbox and its config.

use super::api_error::ApiError;
use crate::db::{DbError, PgPool, PooledClient};
use crate::outbox::Outbox;
use crate::CourierConfig;
use std::sync::Arc;

impl ServiceContext {
    /// A pooled connection for a request; `what` names the work in the error.
    pub async fn connection(&self, what: &str) -> Result<PooledClient<'_>, ApiError> {
        Ok(self.pool.get().await.map_err(DbError::pool(what))?)
    }
}

/// What every HTTP handler of a service gets (as `web::Data<ServiceContext>`).
#[derive(Clone)]
pub struct ServiceContext {
    pub service: &'static str,
    /// The service's pool (its own role, its schema on the search path).
    pub pool: PgPool,
    /// Appends events in the handler's transaction.
    pub outbox: Outbox,
    pub config: Arc<CourierConfig>,
}
