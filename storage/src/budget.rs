//! Byte budgets the logs of one shard share: how much memory all their tail
//! caches may hold together, and how much all their read-ahead blocks may.
//!
//! Runs on: one shard; a budget is `Rc`-shared by that shard's logs and
//! never crosses threads. Two ways to account against it:
//! - [`ByteBudget::add`] / [`ByteBudget::sub`], for an owner that keeps
//!   its own count and evicts while [`ByteBudget::over`] (the tail cache:
//!   every unwritten batch must stay cached, so it may go over for a while);
//! - [`ByteBudget::try_reserve`], for memory that is optional (a block read
//!   ahead): the reservation is refused when it does not fit, and it gives
//!   its bytes back when dropped, so what it accounts for cannot leak.

use std::cell::Cell;
use std::rc::Rc;

/// Bytes used against a limit, by all the logs of one shard.
#[derive(Debug)]
pub struct ByteBudget {
    used: Cell<usize>,
    limit: usize,
    /// Reservations refused for lack of room.
    refused: Cell<u64>,
}

impl ByteBudget {
    pub fn new(limit: usize) -> Rc<ByteBudget> {
        Rc::new(ByteBudget {
            used: Cell::new(0),
            limit,
            refused: Cell::new(0),
        })
    }

    pub fn used(&self) -> usize {
        self.used.get()
    }

    /// Reservations refused since the budget was made.
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    /// Whether `bytes` more would stay within the limit.
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        self.used.get() + bytes <= self.limit
    }

    pub(crate) fn over(&self) -> bool {
        self.used.get() > self.limit
    }

    pub(crate) fn add(&self, bytes: usize) {
        self.used.set(self.used.get() + bytes);
    }

    pub(crate) fn sub(&self, bytes: usize) {
        debug_assert!(bytes <= self.used.get(), "a budget gives back only what it was given");
        self.used.set(self.used.get().saturating_sub(bytes));
    }

    /// `bytes` of the budget, held until the reservation is dropped; `None`
    /// (and counted as refused) if they would take it past its limit.
    pub(crate) fn try_reserve(self: &Rc<Self>, bytes: usize) -> Option<Reservation> {
        if !self.fits(bytes) {
            self.refused.set(self.refused.get() + 1);
            return None;
        }
        self.add(bytes);
        Some(Reservation {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes held in a [`ByteBudget`], given back on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Rc<ByteBudget>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_within_the_limit_and_give_their_bytes_back() {
        let budget = ByteBudget::new(10);
        let a = budget.try_reserve(6).expect("fits");
        assert!(budget.try_reserve(5).is_none(), "6 + 5 is over 10");
        assert_eq!(budget.refused(), 1);
        let b = budget.try_reserve(4).expect("6 + 4 fits exactly");
        assert_eq!(budget.used(), 10);
        drop(a);
        assert_eq!(budget.used(), 4);
        drop(b);
        assert_eq!(budget.used(), 0);
        budget.add(12);
        assert!(budget.over());
        budget.sub(12);
        assert!(!budget.over());
    }
}
