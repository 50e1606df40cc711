//! `nop` cleaning: no background writeback at all. Dirty lines are written back only when the
//! cache is forced to (a `writeback` command, leaving a lazy mode, stopping, an allocation that
//! found no clean line, or the rate controller) — then oldest-dirtied first.

use crate::lists::{ListArena, ListId};
use crate::policy::LineView;
use crate::policy::cleaning::Cleaning;
use crate::units::{LineId, Nanos};

/// Lines written back per forced iteration.
const BATCH: usize = 128;

/// No background cleaning.
pub struct Nop {
    list: ListId,
}

impl Nop {
    /// Creates the policy's one list in `lists`.
    pub fn new(lists: &mut ListArena) -> Nop {
        Nop {
            list: lists.new_list(),
        }
    }
}

impl Cleaning for Nop {
    fn name(&self) -> &'static str {
        "nop"
    }

    fn on_dirty(&mut self, lists: &mut ListArena, line: LineId, _now: Nanos, _v: &dyn LineView) {
        // Keep the original dirtying order: a rewritten line keeps its place.
        if !lists.is_linked(line.0) {
            lists.push_front(self.list, line.0);
        }
    }

    fn on_clean(&mut self, lists: &mut ListArena, line: LineId, _v: &dyn LineView) {
        lists.unlink(line.0);
    }

    fn on_client_io(&mut self, _now: Nanos) {}

    fn pick(
        &mut self,
        _now: Nanos,
        lists: &mut ListArena,
        view: &dyn LineView,
        max: usize,
        force: bool,
        out: &mut Vec<LineId>,
    ) -> Option<Nanos> {
        if !force {
            return None;
        }
        let mut cur = lists.back(self.list);
        let start = out.len();
        while let Some(n) = cur {
            cur = lists.next_towards_back(self.list, n);
            if !view.busy(LineId(n)) {
                lists.unlink(n);
                out.push(LineId(n));
                if out.len() - start >= max {
                    break;
                }
            }
        }
        None
    }

    fn batch_max(&self) -> usize {
        BATCH
    }

    fn heap_bytes(&self) -> usize {
        0
    }
}
