//! The registry as the engine reads through it ([`projectionist_core::format::Schemas`]):
//! decoding with what is cached, fetching what a message still needs.

use async_trait::async_trait;
use projectionist_core::format::{SchemaError, Schemas};

use crate::{Error, Registry};

#[async_trait]
impl Schemas for Registry {
    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, SchemaError> {
        self.decode_text(bytes).map_err(classify)
    }

    async fn fetch(&self, ids: &[u32]) -> Result<(), SchemaError> {
        self.prepare(ids.iter().copied()).await.map_err(classify)
    }
}

/// What the engine does with `e`: fetch and read again, wait, or dead-letter the message.
fn classify(e: Error) -> SchemaError {
    match e {
        Error::NotPrepared { id } => SchemaError::NotFetched(id),
        e if e.is_retryable() => SchemaError::Unavailable(e.to_string()),
        e => SchemaError::Invalid(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_goes_where_the_engine_handles_it() {
        assert_eq!(classify(Error::NotPrepared { id: 4 }), SchemaError::NotFetched(4));
        let away = Error::Unavailable { url: "http://r".into(), reason: "refused".into() };
        assert!(matches!(classify(away), SchemaError::Unavailable(_)));
        let unknown = Error::UnknownSchema { id: 9, url: "http://r".into() };
        assert_eq!(classify(unknown), SchemaError::Invalid("schema id 9 is not in the registry at http://r".into()));
    }
}
