//! A batch's messages in Confluent's wire format whose schemas were not fetched when they were
//! read: fetched from the registry before the batch is applied, waiting out a registry that
//! does not answer (the projection's readiness says so), then read again.

use std::collections::BTreeSet;

use projectionist_core::format::SchemaError;
use tokio::sync::watch;

use super::decode::Msg;
use super::{Order, Partition};
use crate::outage::{Awaited, Outage};
use crate::retry::Retry;

impl Partition {
    /// `messages`, those that waited for a schema read again once it is fetched (a schema the
    /// registry does not have, or bytes that do not fit it, then read as a dead letter).
    /// `None` once `order` says stop while the registry does not answer.
    pub(super) async fn with_schemas(&self, messages: Vec<Msg>, mut order: watch::Receiver<Order>) -> Option<Vec<Msg>> {
        let ids: BTreeSet<u32> = messages.iter().flat_map(Msg::schemas_needed).collect();
        let Some(schemas) = self.reader.schemas.as_ref().filter(|_| !ids.is_empty()) else {
            return Some(messages);
        };
        let ids: Vec<u32> = ids.into_iter().collect();
        let mut outage = Outage::of(Awaited::Registry, self.stats.clone(), self.name());
        let fetched = self
            .settings
            .retry
            .run_until(
                || schemas.fetch(&ids),
                |e| match e {
                    SchemaError::Unavailable(_) => Retry::WaitOut,
                    _ => Retry::Never,
                },
                |e, retrying| outage.failed(e, retrying),
                async move {
                    let _ = order.wait_for(|o| *o != Order::Run).await;
                },
            )
            .await?;
        if fetched.is_ok() {
            outage.over();
        }
        let max_bytes = self.settings.max_event_bytes;
        let reread = |m: Msg| if m.pending().is_some() { m.reread(&self.reader, max_bytes) } else { m };
        Some(messages.into_iter().map(reread).collect())
    }
}
