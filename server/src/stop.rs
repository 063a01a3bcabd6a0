//! Stop strings over streamed text: text that could still become a stop string is held back,
//! and output ends right before the first match.

/// Scans generated text for stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released.
    held: String,
}

/// What one push releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Text safe to send.
    pub text: String,
    /// The stop string that matched, if any; no more text follows.
    pub matched: Option<String>,
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Adds newly decoded text and returns what can be sent.
    pub fn push(&mut self, delta: &str) -> Released {
        self.held.push_str(delta);
        // Earliest match wins.
        let hit = self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s.clone()))).min_by_key(|(at, _)| *at);
        if let Some((at, s)) = hit {
            let text = self.held[..at].to_owned();
            self.held.clear();
            return Released { text, matched: Some(s) };
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if self.held.ends_with(&s[..i]) {
                    keep = keep.max(i);
                }
            }
        }
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_owned();
        self.held.drain(..cut);
        Released { text, matched: None }
    }

    /// Releases whatever is held (generation ended without a match).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_partial_matches_and_cuts_at_match() {
        let mut m = StopMatcher::new(vec!["\n\n".into(), "END".into()]);
        assert_eq!(m.push("abc\n").text, "abc");
        let r = m.push("\nxyz");
        assert_eq!(r, Released { text: String::new(), matched: Some("\n\n".into()) });
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("xE").text, "x");
        assert_eq!(m.push("N").text, "");
        assert_eq!(m.push("x").text, "ENx");
        assert_eq!(m.push("aEND b"), Released { text: "a".into(), matched: Some("END".into()) });
    }

    #[test]
    fn no_stops_passes_everything() {
        let mut m = StopMatcher::new(vec![]);
        assert_eq!(m.push("héllo").text, "héllo");
        assert_eq!(m.flush(), "");
    }
}
