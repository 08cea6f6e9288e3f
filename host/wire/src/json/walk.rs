//! A walk over JSON text that reads the few fields its caller wants and
//! skips everything else to its end (strings by `memchr`), without a tree:
//! the gateway reads an engine answer's token fields with it, the test
//! engine a prompt of token ids. Through serde the same reads cost several
//! times as much (every skipped field parsed, every id read through a
//! `Value`).
//!
//! It reads the shape serde_json and engines write; anything else (a key
//! with an escape, whitespace where a caller's reader takes none) is
//! `None`, and the caller reads the text through serde, which decides.
//! Values the tree readers could refuse (numbers with an exponent or over
//! 20 characters, strings with `\u` escapes) are read as [`super::check`]
//! reads them, and nesting is held to the walker's `max_depth`.

use super::{check, number_end, string_end};

/// A position in JSON text, and how many arrays and objects it is in.
pub struct Walker<'a> {
    b: &'a [u8],
    i: usize,
    depth: usize,
    max_depth: usize,
}

impl<'a> Walker<'a> {
    /// A walk over `text` from its start, nesting at most `max_depth`.
    pub fn new(text: &'a [u8], max_depth: usize) -> Self {
        Walker {
            b: text,
            i: 0,
            depth: 0,
            max_depth,
        }
    }

    /// The next byte after whitespace, not taken; `None` at the end.
    fn peek(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
        self.b.get(self.i).copied()
    }

    /// Nothing but whitespace is left.
    pub fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }

    /// Where the next value starts (after whitespace).
    pub fn position(&mut self) -> usize {
        self.peek();
        self.i
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// Takes a `null`, if that is what comes next.
    pub fn null(&mut self) -> bool {
        self.peek();
        let null = self.b.get(self.i..).is_some_and(|r| r.starts_with(b"null"));
        if null {
            self.i += 4;
        }
        null
    }

    /// A string without escapes, between its quotes.
    fn plain_str(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        let end = start + memchr::memchr2(b'"', b'\\', self.b.get(start..)?)?;
        (self.b[end] == b'"').then(|| {
            self.i = end + 1;
            &self.b[start..end]
        })
    }

    /// Skips a string; one with a `\u` escape (a lone surrogate is refused
    /// by tree readers) is read as `check` reads it.
    fn skip_str(&mut self) -> Option<()> {
        self.eat(b'"')?;
        let start = self.i - 1;
        let (end, unicode_escape) = string_end(self.b, start)?;
        self.i = end;
        if unicode_escape {
            checked(&self.b[start..end])?;
        }
        Some(())
    }

    /// Skips a number; one that may not be finite is read as `check`
    /// reads it.
    fn skip_number(&mut self) -> Option<()> {
        let start = self.i;
        let (end, unbounded) = number_end(self.b, start);
        self.i = end;
        if unbounded {
            checked(&self.b[start..end])?;
        }
        Some(())
    }

    /// Skips one value and gives its text.
    pub fn value(&mut self) -> Option<&'a [u8]> {
        let start = self.position();
        match *self.b.get(start)? {
            b'"' => self.skip_str()?,
            b'-' | b'0'..=b'9' => self.skip_number()?,
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match *self.b.get(self.i)? {
                        b'"' => {
                            self.skip_str()?;
                            continue;
                        }
                        b'-' | b'0'..=b'9' => {
                            self.skip_number()?;
                            continue;
                        }
                        b'{' | b'[' => {
                            depth += 1;
                            if self.depth + depth > self.max_depth {
                                return None;
                            }
                        }
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                while let Some(&c) = self.b.get(self.i) {
                    if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    self.i += 1;
                }
            }
        }
        (self.i > start).then(|| &self.b[start..self.i])
    }

    /// Skips one value.
    pub fn skip(&mut self) -> Option<()> {
        self.value().map(drop)
    }

    /// One value as serde_json reads it into `T` (the rare fields).
    pub fn serde<T: serde::de::DeserializeOwned>(&mut self) -> Option<T> {
        serde_json::from_slice(self.value()?).ok()
    }

    /// The value at the walk's position as `read` reads it from the text
    /// that starts there: `read` gives the value and its length in bytes;
    /// `None` leaves the walk where it was.
    pub fn read<T>(&mut self, read: impl FnOnce(&'a [u8]) -> Option<(T, usize)>) -> Option<T> {
        let start = self.position();
        let (value, len) = read(self.b.get(start..)?)?;
        self.i = start + len;
        Some(value)
    }

    /// `field(key)` for each key of an object, in order.
    pub fn object(
        &mut self,
        mut field: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
    ) -> Option<()> {
        self.items(b'{', b'}', |r| {
            let key = r.plain_str()?;
            r.eat(b':')?;
            field(r, key)
        })
    }

    /// `item()` for each element of an array.
    pub fn array(&mut self, item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.items(b'[', b']', item)
    }

    /// `item()` for each comma-separated item between `open` and `close`.
    fn items(
        &mut self,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        self.eat(open)?;
        self.depth += 1;
        if self.depth > self.max_depth {
            return None;
        }
        if self.peek()? != close {
            loop {
                item(self)?;
                match self.peek()? {
                    b',' => self.i += 1,
                    c if c == close => break,
                    _ => return None,
                }
            }
        }
        self.i += 1;
        self.depth -= 1;
        Some(())
    }
}

/// `text` (one value) within the limits, as `check` reads it.
fn checked(text: &[u8]) -> Option<()> {
    let text = std::str::from_utf8(text).ok()?;
    check(text, 1).ok()
}
