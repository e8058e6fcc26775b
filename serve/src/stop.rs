//! A choice's text as OpenAI returns it: without the stop string that ended it. While
//! streaming, the tail that could still become a stop string is held back until the next
//! piece shows whether it does.

/// The text of one choice, piece by piece.
#[derive(Debug, Default)]
pub(crate) struct StopText {
    stops: Vec<String>,
    /// Everything generated so far.
    text: String,
    /// Bytes of `text` already handed out.
    sent: usize,
    /// Where a stop string begins, once one appeared.
    cut: Option<usize>,
}

impl StopText {
    pub fn new(stops: &[String]) -> StopText {
        StopText {
            stops: stops.to_vec(),
            ..StopText::default()
        }
    }

    /// Adds a generated piece and returns the text that is now certain to be output.
    pub fn push(&mut self, piece: &str) -> String {
        if self.cut.is_some() {
            return String::new();
        }
        self.text.push_str(piece);
        // A stop string may straddle earlier pieces: search from the held-back tail.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let from = floor_char(&self.text, self.sent.saturating_sub(longest));
        self.cut = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        let end = match self.cut {
            Some(c) => c,
            // Hold back what could still begin a stop string.
            None => floor_char(
                &self.text,
                self.text.len().saturating_sub(longest.saturating_sub(1)),
            ),
        };
        self.take(end)
    }

    /// Whatever is left once the sequence ended (up to the stop string, when one came).
    pub fn finish(&mut self) -> String {
        let end = self.cut.unwrap_or(self.text.len());
        self.take(end)
    }

    /// The whole text without the stop string.
    pub fn full(&self) -> &str {
        &self.text[..self.cut.unwrap_or(self.text.len())]
    }

    fn take(&mut self, end: usize) -> String {
        if end <= self.sent {
            return String::new();
        }
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        out
    }
}

/// The largest char boundary of `s` at or below `i`.
fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut t = StopText::new(&stops);
        let mut out: Vec<String> = pieces.iter().map(|p| t.push(p)).collect();
        out.push(t.finish());
        (out, t.full().to_string())
    }

    #[test]
    fn without_stops_every_piece_goes_out_at_once() {
        let (out, full) = run(&[], &["Hel", "lo", " wörld"]);
        assert_eq!(out, ["Hel", "lo", " wörld", ""]);
        assert_eq!(full, "Hello wörld");
    }

    #[test]
    fn a_stop_string_across_pieces_is_never_sent() {
        let (out, full) = run(&["\n\nUser"], &["Hi", " there\n", "\nUs", "er: more"]);
        assert_eq!(out.concat(), "Hi there");
        assert_eq!(full, "Hi there");
        // The held-back tail went out only once it could no longer be a stop string.
        let (out, _) = run(&["END"], &["abc", "E", "x", "yz"]);
        assert_eq!(out, ["a", "b", "c", "Ex", "yz"]);
        assert_eq!(out.concat(), "abcExyz");
    }

    #[test]
    fn the_earliest_stop_string_wins_and_nothing_follows_it() {
        let (out, full) = run(&["b", "c"], &["a", "cb", "d"]);
        assert_eq!(full, "a");
        assert_eq!(out.concat(), "a");
    }

    #[test]
    fn multibyte_text_is_held_back_on_char_boundaries() {
        let (out, full) = run(&["日本"], &["é日", "x"]);
        assert_eq!(out.concat(), "é日x");
        assert_eq!(full, "é日x");
    }
}
