//! Text in and out for `vkfuse generate`: the model's `tokenizer.json` loaded with the
//! `tokenizers` crate, and incremental decoding that prints each token's text as soon as it is
//! whole.

use anyhow::{anyhow, Result};
use tokenizers::Tokenizer;

/// A model's tokenizer.
pub struct Text {
    tokenizer: Tokenizer,
}

impl Text {
    /// Loads a `tokenizer.json` from its text; `origin` names where it came from in errors.
    pub fn from_json(json: &str, origin: &str) -> Result<Text> {
        let tokenizer = json
            .parse::<Tokenizer>()
            .map_err(|e| anyhow!("{origin}: the tokenizer does not load: {e}"))?;
        Ok(Text { tokenizer })
    }

    /// The ids of `text` as transformers' `tokenizer(text)` gives them (special tokens written
    /// in the text are matched; the post-processor's special tokens, if any, added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| anyhow!("tokenizing the prompt: {e}"))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| anyhow!("decoding ids {ids:?}: {e}"))
    }

    /// A stream that turns generated ids into text pieces.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            text: self,
            ids: vec![],
            prefix: 0,
            read: 0,
            extra: 0,
        }
    }
}

/// Incremental decoding. A byte-level BPE token may hold part of a UTF-8 character, and some
/// decoders change a token's text by what precedes it (a leading space), so the newest ids are
/// decoded together with the ids before them back to the last point where everything decoded
/// was whole (`prefix`, with `read` one such point later as context), and only text past what
/// was already returned is returned. The text is held back only where it ends in a
/// replacement character, and only that one: a decoder turns each invalid byte run into one
/// U+FFFD, so at most the last can still become a character.
pub struct TextStream<'t> {
    text: &'t Text,
    ids: Vec<u32>,
    /// Start of the window decoded.
    prefix: usize,
    /// The ids in `prefix..read` decode to whole text, all of it returned.
    read: usize,
    /// Bytes returned past the text of `prefix..read`.
    extra: usize,
}

/// The bytes at the end of `text` that may still change: a final U+FFFD.
fn unsettled(text: &str) -> usize {
    if text.ends_with('\u{FFFD}') {
        '\u{FFFD}'.len_utf8()
    } else {
        0
    }
}

impl TextStream<'_> {
    /// Adds a generated id; returns the text it completes (usually its own, sometimes nothing
    /// yet, sometimes that of earlier ids too).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let base = self.text.decode(&self.ids[self.prefix..self.read])?;
        let all = self.text.decode(&self.ids[self.prefix..])?;
        let returned = base.len() + self.extra;
        let settled = all.len() - unsettled(&all);
        let mut out = String::new();
        if all.starts_with(base.as_str()) && settled > returned {
            if let Some(new) = all.get(returned..settled) {
                out = new.to_string();
            }
        }
        let returned = returned + out.len();
        if unsettled(&all) == 0 && returned == all.len() {
            // Everything is whole and returned: the next window starts here, with the ids
            // since the last such point as context.
            self.prefix = self.read;
            self.read = self.ids.len();
            self.extra = 0;
        } else {
            self.extra = returned - base.len();
        }
        Ok(out)
    }

    /// The text not yet returned (a character cut off by the end of generation, as U+FFFD).
    pub fn finish(&mut self) -> Result<String> {
        let base = self.text.decode(&self.ids[self.prefix..self.read])?;
        let all = self.text.decode(&self.ids[self.prefix..])?;
        let returned = base.len() + self.extra;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        self.extra = 0;
        Ok(all.get(returned..).unwrap_or_default().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/qwen3-tied")
    }

    fn text() -> Text {
        let json = std::fs::read_to_string(fixture().join("tokenizer.json")).unwrap();
        Text::from_json(&json, "qwen3-tied/tokenizer.json").unwrap()
    }

    /// `(text, ids)` of the fixture's `tokenizer_checks`: what transformers' tokenizer gave.
    fn checks() -> Vec<(String, Vec<u32>)> {
        let json = std::fs::read_to_string(fixture().join("reference.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let checks = v["tokenizer_checks"].as_array().expect("tokenizer_checks");
        assert!(checks.len() >= 4);
        checks
            .iter()
            .map(|c| {
                let ids = c["ids"].as_array().unwrap();
                let ids = ids.iter().map(|i| i.as_u64().unwrap() as u32).collect();
                (c["text"].as_str().unwrap().to_string(), ids)
            })
            .collect()
    }

    #[test]
    fn should_tokenize_like_transformers() {
        let t = text();
        for (text, ids) in checks() {
            assert_eq!(t.encode(&text).unwrap(), ids, "{text:?}");
        }
    }

    #[test]
    fn should_stream_the_same_text_as_decoding_all_ids_at_once() {
        let t = text();
        for (text, ids) in checks() {
            let mut stream = t.stream();
            let mut pieces = vec![];
            for &id in &ids {
                pieces.push(stream.push(id).unwrap());
            }
            pieces.push(stream.finish().unwrap());
            let streamed = pieces.concat();
            assert_eq!(streamed, t.decode(&ids).unwrap(), "{text:?}");
            // The special tokens are left out; everything else round-trips.
            if !text.contains("<|") {
                assert_eq!(streamed, text);
            }
            // No piece ever holds a partial character.
            assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
        }
    }

    #[test]
    fn should_hold_a_split_character_until_it_is_whole() {
        let t = text();
        // "😀" is four bytes, four byte-level tokens: nothing until the last.
        let ids = t.encode("😀").unwrap();
        assert_eq!(ids.len(), 4, "{ids:?}");
        let mut stream = t.stream();
        let pieces: Vec<String> = ids.iter().map(|&i| stream.push(i).unwrap()).collect();
        assert_eq!(pieces, ["", "", "", "😀"]);
        // Cut off by the end of generation: the partial character comes out as U+FFFD.
        let mut stream = t.stream();
        assert_eq!(stream.push(ids[0]).unwrap(), "");
        assert_eq!(stream.finish().unwrap(), "\u{FFFD}");
    }

    #[test]
    fn should_stream_invalid_bytes_as_they_come_holding_only_the_last() {
        // What a random-weight model produces: lone continuation bytes never become text, so
        // each is returned as U+FFFD once the next shows it is not the start of a character.
        let t = text();
        let emoji = t.encode("😀").unwrap();
        let lone = emoji[3]; // 0x80
        let mut stream = t.stream();
        let pieces: Vec<String> = [lone, lone, lone]
            .iter()
            .map(|&i| stream.push(i).unwrap())
            .collect();
        assert_eq!(pieces, ["", "\u{FFFD}", "\u{FFFD}"]);
        assert_eq!(stream.finish().unwrap(), "\u{FFFD}");

        // A character split over four ids right after an invalid byte still comes out whole.
        let ids = [&[lone][..], &emoji].concat();
        let mut stream = t.stream();
        let pieces: Vec<String> = ids.iter().map(|&i| stream.push(i).unwrap()).collect();
        assert_eq!(pieces, ["", "\u{FFFD}", "", "", "😀"]);
        assert_eq!(stream.finish().unwrap(), "");
        assert_eq!(pieces.concat(), t.decode(&ids).unwrap());
    }

    #[test]
    fn should_stream_any_id_sequence_to_the_text_of_all_of_it() {
        // Whatever the model generates (here: 300 pseudo-random sequences over the whole
        // vocabulary, special tokens included), the pieces add up to the decoded text.
        let t = text();
        let mut seed = 0x2545_f491_u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..300 {
            let len = 1 + next(24) as usize;
            let ids: Vec<u32> = (0..len).map(|_| next(372) as u32).collect();
            let mut stream = t.stream();
            let mut streamed = String::new();
            for &id in &ids {
                streamed += &stream.push(id).unwrap();
            }
            streamed += &stream.finish().unwrap();
            assert_eq!(streamed, t.decode(&ids).unwrap(), "{ids:?}");
        }
    }

    #[test]
    fn should_refuse_a_tokenizer_that_does_not_load() {
        let err = Text::from_json("{\"model\": 3}", "FILE").err().unwrap();
        assert!(
            err.to_string()
                .starts_with("FILE: the tokenizer does not load"),
            "{err}"
        );
    }
}
