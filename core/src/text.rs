//! Bounding free text before it is shown: condition messages, Event notes, log lines.
//!
//! Some of what the controller writes quotes text it does not control (an agent's conflict
//! reason, a user's annotation). The API refuses a condition message over 32,768 bytes
//! (with 422 Invalid) and an Event note over 1 kB, so such text is cut here, on a
//! character boundary, and marked with [`ELLIPSIS`].

/// Marks text that was cut.
pub const ELLIPSIS: &str = "...";

/// Cuts `s` to at most `max` bytes on a character boundary, ending in [`ELLIPSIS`] when
/// it was cut. Text that fits is returned as it is (no allocation).
pub fn bounded(mut s: String, max: usize) -> String {
    bound(&mut s, max);
    s
}

/// [`bounded`] in place.
pub fn bound(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max.saturating_sub(ELLIPSIS.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    // A `max` below the ellipsis itself cannot hold it: the text is only cut.
    if s.len() + ELLIPSIS.len() <= max {
        s.push_str(ELLIPSIS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_char_boundaries_with_an_ellipsis() {
        assert_eq!(bounded("short".into(), 10), "short");
        assert_eq!(bounded("exactly10!".into(), 10), "exactly10!");
        assert_eq!(bounded("eleven char".into(), 10), "eleven ...");
        // "é" is two bytes: the cut backs off to a boundary.
        let cut = bounded("ééééé".into(), 6);
        assert_eq!(cut, "é...");
        for max in 0..20 {
            let cut = bounded("aé€😀b".repeat(3), max);
            assert!(cut.len() <= max, "{max}: {cut:?}");
        }
        assert_eq!(bounded("abcdef".into(), 2), "");
    }
}
