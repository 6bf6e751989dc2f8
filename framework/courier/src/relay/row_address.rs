//! Where a claim left a row: its `ctid` (heap block and line), so the mark updates it there
//! instead of looking it up by seq in an index (~1.3 µs a row of the mark's ~8 in a SQL loop
//! of the relay's statements).
//!
//! Safe although an address can be reused: the mark also requires the claimer's lock token,
//! which only a claim sets and every publishing mark clears. A live row version carrying the
//! token is the one a claim of this token created, at the address that claim returned (every update writes a new version
//! elsewhere, so a row released and claimed again comes back with its new address). If the
//! row moved since (another owner took it over), nothing at the old address matches, and the
//! mark leaves the row for a later publish, as the token alone did before.

use bytes::{BufMut, BytesMut};
use std::error::Error;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

/// A row version's physical address (PostgreSQL's `tid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RowAddress {
    block: u32,
    line: u16,
}

impl<'a> FromSql<'a> for RowAddress {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        // Binary `tid`: block number (4 bytes) and line pointer (2 bytes), big-endian.
        let raw: [u8; 6] = raw
            .try_into()
            .map_err(|_| format!("a tid is 6 bytes, got {}", raw.len()))?;
        Ok(Self {
            block: u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]),
            line: u16::from_be_bytes([raw[4], raw[5]]),
        })
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TID
    }
}

impl ToSql for RowAddress {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.put_u32(self.block);
        out.put_u16(self.line);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TID
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_round_trips_through_the_binary_format() {
        let address = RowAddress {
            block: 0x0102_0304,
            line: 0x0506,
        };
        let mut out = BytesMut::new();
        address.to_sql(&Type::TID, &mut out).expect("encode");
        assert_eq!(&out[..], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            RowAddress::from_sql(&Type::TID, &out).expect("decode"),
            address
        );
        assert!(RowAddress::from_sql(&Type::TID, &[1, 2, 3]).is_err());
    }
}
