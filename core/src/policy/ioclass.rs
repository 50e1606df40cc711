//! IO classes (stub; being written).
use crate::units::{CoreId, Lba};

/// What a classifier sees of a request.
#[derive(Copy, Clone, Debug)]
pub struct IoInfo {
    /// Core.
    pub core: CoreId,
    /// Direction.
    pub is_write: bool,
    /// First block.
    pub lba: Lba,
    /// Bytes.
    pub bytes: u64,
}

/// One IO class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoClass {
    /// Id.
    pub id: u8,
    /// Rule text.
    pub name: String,
    /// Priority; None = pinned.
    pub priority: Option<u8>,
    /// Allocation share, percent.
    pub allocation_pct: u8,
}

/// CSV error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Table.
#[derive(Clone, Debug)]
pub struct IoClassTable {
    classes: Vec<IoClass>,
}
impl IoClassTable {
    /// Default.
    pub fn default_table() -> IoClassTable {
        IoClassTable {
            classes: vec![IoClass {
                id: 0,
                name: "unclassified".into(),
                priority: Some(255),
                allocation_pct: 100,
            }],
        }
    }
    /// Parse.
    pub fn parse_csv(_text: &str) -> Result<IoClassTable, CsvError> {
        Ok(Self::default_table())
    }
    /// Classify.
    pub fn classify(&self, _io: &IoInfo) -> u8 {
        0
    }
    /// Class by id.
    pub fn class(&self, id: u8) -> Option<&IoClass> {
        self.classes.iter().find(|c| c.id == id)
    }
    /// All classes.
    pub fn classes(&self) -> impl Iterator<Item = &IoClass> {
        self.classes.iter()
    }
}
