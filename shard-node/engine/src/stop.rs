//! Stopping a search from outside: a deadline, a flag the caller sets, or
//! both.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::error::{Error, Result};

/// When a search gives up: at a deadline, when a flag is set (the caller
/// went away), both, or never. Cheap to clone; a search looks at it every
/// few graph expansions and before reading vectors and payloads, and a
/// search that gives up returns [`Error::Stopped`].
///
/// ```
/// use std::sync::{Arc, atomic::AtomicBool};
/// use std::time::{Duration, Instant};
/// use shoal_engine::Stop;
///
/// let cancelled = Arc::new(AtomicBool::new(false));
/// let stop = Stop::at(Instant::now() + Duration::from_millis(50)).with_flag(Arc::clone(&cancelled));
/// # let _ = stop;
/// ```
#[derive(Clone, Debug, Default)]
pub struct Stop {
    deadline: Option<Instant>,
    flag: Option<Arc<AtomicBool>>,
}

impl Stop {
    /// Never stops.
    pub const fn never() -> Stop {
        Stop { deadline: None, flag: None }
    }

    /// Stops once `deadline` has passed.
    pub fn at(deadline: Instant) -> Stop {
        Stop { deadline: Some(deadline), flag: None }
    }

    /// Also stops once `flag` is true (set it when the caller has gone).
    pub fn with_flag(mut self, flag: Arc<AtomicBool>) -> Stop {
        self.flag = Some(flag);
        self
    }

    /// `Err(Error::Stopped)` if the search must stop now.
    pub(crate) fn check(&self) -> Result<()> {
        // The flag first: a load, where the deadline reads the clock.
        if self.flag.as_ref().is_some_and(|f| f.load(Ordering::Relaxed)) {
            return Err(Error::Stopped { deadline_passed: false });
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::Stopped { deadline_passed: true });
        }
        Ok(())
    }

    /// A pacer that checks this every [`Pacer::EVERY`] steps.
    pub(crate) fn pacer(&self) -> Pacer<'_> {
        Pacer { stop: self, left: Pacer::EVERY }
    }
}

/// Checks a [`Stop`] every few steps of a loop: a graph expansion costs
/// about a microsecond and reading the clock about 20 ns, so a check every
/// 16 costs nothing measurable and stops a search within microseconds.
pub(crate) struct Pacer<'s> {
    stop: &'s Stop,
    left: u32,
}

impl Pacer<'_> {
    const EVERY: u32 = 16;

    /// Counts one step; checks the stop on every [`Self::EVERY`]th.
    #[inline]
    pub(crate) fn step(&mut self) -> Result<()> {
        self.left -= 1;
        if self.left > 0 {
            return Ok(());
        }
        self.left = Self::EVERY;
        self.stop.check()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn says_why_it_stopped() {
        assert!(Stop::never().check().is_ok());
        assert!(Stop::at(Instant::now() + Duration::from_secs(3600)).check().is_ok());
        let passed = Stop::at(Instant::now() - Duration::from_millis(1));
        assert!(matches!(passed.check(), Err(Error::Stopped { deadline_passed: true })));
        let flag = Arc::new(AtomicBool::new(false));
        let stop = Stop::at(Instant::now() + Duration::from_secs(3600)).with_flag(Arc::clone(&flag));
        assert!(stop.check().is_ok());
        flag.store(true, Ordering::Relaxed);
        let err = stop.check().unwrap_err();
        assert!(matches!(err, Error::Stopped { deadline_passed: false }), "{err:?}");
        assert!(err.to_string().contains("cancelled"), "{err}");
        assert!(passed.check().unwrap_err().to_string().contains("deadline"));
    }

    #[test]
    fn a_pacer_checks_every_few_steps() {
        let flag = Arc::new(AtomicBool::new(true));
        let stop = Stop::never().with_flag(flag);
        let mut pacer = stop.pacer();
        for _ in 1..Pacer::EVERY {
            assert!(pacer.step().is_ok());
        }
        assert!(pacer.step().is_err());
    }
}
