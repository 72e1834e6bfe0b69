//! Request classes: how urgent a read is, so both ends can serve the urgent ones first.
//!
//! The client tags each Read with a class when the session has the
//! [`PRIORITY`](crate::features::PRIORITY) feature (bits 1–2 of the Read flags byte,
//! [`crate::Request::Read`]); ferryd then writes a connection's responses most urgent
//! first. Every other request is [`Class::Demand`]. The order of the variants is the
//! order of urgency: a smaller value is served first.

/// How urgent a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Class {
    /// Someone is waiting for it now (a read(2) through the mount, a stat, a listing).
    #[default]
    Demand = 0,
    /// Read-ahead a reader will probably want soon (sequential read-ahead, tree prefetch).
    Prediction = 1,
    /// Work nobody waits for (the mirror filling a local copy).
    Background = 2,
}

impl Class {
    /// Every class, most urgent first.
    pub const ALL: [Class; 3] = [Class::Demand, Class::Prediction, Class::Background];

    /// The class's two-bit wire value.
    pub fn to_bits(self) -> u8 {
        self as u8
    }

    /// The class of a two-bit wire value; `None` for the unused value 3 (or anything larger).
    pub fn from_bits(v: u8) -> Option<Class> {
        match v {
            0 => Some(Class::Demand),
            1 => Some(Class::Prediction),
            2 => Some(Class::Background),
            _ => None,
        }
    }

    /// A short lowercase name, for logs, status and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Demand => "demand",
            Class::Prediction => "prediction",
            Class::Background => "background",
        }
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_round_trip_and_order() {
        for c in Class::ALL {
            assert_eq!(Class::from_bits(c.to_bits()), Some(c));
        }
        assert_eq!(Class::from_bits(3), None);
        assert!(Class::Demand < Class::Prediction && Class::Prediction < Class::Background);
    }
}
