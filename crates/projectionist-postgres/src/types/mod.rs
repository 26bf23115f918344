//! PostgreSQL's column types, as far as the engine needs to know them: an integer type's name
//! and range.

/// An integer column type: its names, its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntType {
    Small,
    Int,
    Big,
}

impl IntType {
    /// The integer type named `name` (one word, any case: `smallint`, `int2`, `integer`,
    /// `int`, `int4`, `bigint`, `int8`).
    pub(crate) fn named(name: &str) -> Option<Self> {
        let is = |names: &[&str]| names.iter().any(|n| name.eq_ignore_ascii_case(n));
        if is(&["smallint", "int2"]) {
            Some(Self::Small)
        } else if is(&["integer", "int", "int4"]) {
            Some(Self::Int)
        } else if is(&["bigint", "int8"]) {
            Some(Self::Big)
        } else {
            None
        }
    }

    /// The integer type a declaration such as `bigint NOT NULL DEFAULT 0` starts with.
    pub(crate) fn of(declared: &str) -> Option<Self> {
        declared.split_whitespace().next().and_then(Self::named)
    }

    /// The type's name in SQL.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Small => "smallint",
            Self::Int => "integer",
            Self::Big => "bigint",
        }
    }

    /// The values the type takes, from the least to the greatest.
    pub(crate) fn range(self) -> (i128, i128) {
        match self {
            Self::Small => (i16::MIN.into(), i16::MAX.into()),
            Self::Int => (i32::MIN.into(), i32::MAX.into()),
            Self::Big => (i64::MIN.into(), i64::MAX.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::IntType;

    #[test]
    fn an_integer_type_is_read_from_the_first_word_of_its_declaration() {
        assert_eq!(IntType::of("bigint NOT NULL DEFAULT 0"), Some(IntType::Big));
        assert_eq!(IntType::of("INT4"), Some(IntType::Int));
        assert_eq!(IntType::of("smallint"), Some(IntType::Small));
        assert_eq!(IntType::of("numeric(12,2)"), None);
        assert_eq!(IntType::of("bigserial"), None);
    }
}
