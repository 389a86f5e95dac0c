//! Recovery of a journal, pure: what each file holds ([`scan_file`]), which
//! frames must be replayed ([`plan`]), and what replaying one entry does to
//! its log ([`replay_actions`]).
//!
//! # Which frames
//! Every frame names a *replay-from* LSN: every entry of an earlier frame
//! was durable in its log's segments when the frame was written. The
//! newest valid frame's replay-from is where recovery starts, and every
//! frame from there to the newest must be there, in order: a missing or
//! damaged one is an error (acknowledged records would be lost), not a
//! shorter replay.
//!
//! A file ends at the first frame that is zero (never written), stale (left
//! from the file's previous use, or older than expected) or torn. Only the
//! newest frame can be torn in a crash: the writer has one frame in flight
//! and starts a new file after recovery rather than write after a torn
//! frame. So a damaged frame that a later file does not take over (its
//! first LSN is past the damaged one's) was acknowledged, and fails the
//! recovery.
//!
//! # Replaying an entry
//! Entries are applied in journal order, each batch on its own, like a
//! replica's append ([`replay_actions`]): a batch that starts at the log's
//! end is appended; one that starts before it is already there (or is
//! cut by a later truncation in the journal) and is skipped; one past the
//! end is skipped if a later truncation cuts to the log's end or below
//! (the segment lost it with that cut), else records are missing: an
//! error. A truncation cuts a log that is longer than it; a start-over
//! empties a log that ends before it (a follower starts over only there). Replaying from
//! any frame whose predecessors are durable thus ends in the state the
//! journal describes, whatever part of it the segments hold (the property
//! test `replay_from_any_durable_point_ends_in_the_final_state`).

use bytes::Bytes;

use super::format::{decode_file_header, decode_frame, Change, Entry, FileHeader, Frame, FrameError, FILE_HEADER_LEN};
use crate::Offset;

/// Why a file's scan stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileEnd {
    /// At the end of the bytes, or at zeros (never written).
    Clean,
    /// At a frame of the file's previous use, or of another turn.
    Stale,
    /// At a frame that does not check out (torn or damaged), expected to
    /// be this LSN.
    Damaged { lsn: u64, why: String },
}

/// What one journal file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileScan {
    pub header: FileHeader,
    pub frames: Vec<Frame>,
    /// Where the valid frames end (the file position after the last).
    pub valid_end: u64,
    pub end: FileEnd,
}

/// Scans a whole file image. `Err` when the header does not check out (a
/// file created and never started, or not a journal file).
pub fn scan_file(image: &Bytes) -> Result<FileScan, FrameError> {
    let header = decode_file_header(image)?;
    let mut frames = Vec::new();
    let mut at = FILE_HEADER_LEN;
    let mut lsn = header.first_lsn;
    let end = loop {
        if at >= image.len() {
            break FileEnd::Clean;
        }
        match decode_frame(&image.slice(at..), header.seq, lsn) {
            Ok(frame) => {
                at += frame.disk_len;
                lsn += 1;
                frames.push(frame);
            }
            Err(FrameError::Zero) => break FileEnd::Clean,
            Err(FrameError::Stale { .. }) => break FileEnd::Stale,
            Err(e @ (FrameError::Short | FrameError::Corrupt(_))) => {
                break FileEnd::Damaged {
                    lsn,
                    why: e.to_string(),
                };
            }
        }
    };
    Ok(FileScan {
        header,
        frames,
        valid_end: at as u64,
        end,
    })
}

/// What recovery replays, and where the writer goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The first frame replayed.
    pub replay_from: u64,
    /// The LSN the next frame written gets.
    pub next_lsn: u64,
    /// The sequence number the next file started gets.
    pub next_file_seq: u64,
    /// The entries to replay, in order, with their frames' LSNs.
    pub entries: Vec<(u64, Entry)>,
}

/// The replay plan for the scanned files (any order; `name` says which
/// file, for errors).
pub fn plan(files: &[(String, FileScan)]) -> Result<Plan, String> {
    let mut files: Vec<&(String, FileScan)> = files.iter().collect();
    files.sort_by_key(|(_, scan)| scan.header.seq);
    let next_file_seq = files.last().map_or(0, |(_, s)| s.header.seq + 1);
    let newest = files
        .iter()
        .flat_map(|(_, s)| s.frames.iter())
        .max_by_key(|f| f.header.lsn)
        .map(|f| f.header);
    let Some(newest) = newest else {
        // No frame: nothing to replay; go on after the newest file's start.
        let next_lsn = files.iter().map(|(_, s)| s.header.first_lsn).max().unwrap_or(0);
        return Ok(Plan {
            replay_from: next_lsn,
            next_lsn,
            next_file_seq,
            entries: Vec::new(),
        });
    };
    let from = newest.replay_from;
    for (i, (name, scan)) in files.iter().enumerate() {
        let FileEnd::Damaged { lsn, why } = &scan.end else {
            continue;
        };
        // Taken over by the next file (a restart after a torn frame)?
        let taken_over = files[i + 1..]
            .first()
            .is_some_and(|(_, next)| next.header.first_lsn <= *lsn);
        let later_frames = *lsn <= newest.lsn;
        if *lsn >= from && later_frames && !taken_over {
            return Err(format!(
                "journal file {name}: frame {lsn} is damaged ({why}) but frames up to {} follow it: acknowledged \
                 records would be lost",
                newest.lsn
            ));
        }
    }
    let mut needed: Vec<&Frame> = files
        .iter()
        .flat_map(|(_, s)| s.frames.iter())
        .filter(|f| f.header.lsn >= from)
        .collect();
    needed.sort_by_key(|f| f.header.lsn);
    for (i, f) in needed.iter().enumerate() {
        let expected = from + i as u64;
        if f.header.lsn != expected {
            return Err(format!(
                "journal frames {from}..={} are needed but frame {expected} is missing (found {} instead)",
                newest.lsn, f.header.lsn
            ));
        }
    }
    let entries = needed
        .iter()
        .flat_map(|f| f.entries.iter().map(|e| (f.header.lsn, e.clone())))
        .collect();
    Ok(Plan {
        replay_from: from,
        next_lsn: newest.lsn + 1,
        next_file_seq,
        entries,
    })
}

/// One step of a log's history in the journal: a batch (its offsets) or a
/// truncation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    Batch { base: Offset, next: Offset },
    Cut { to: Offset },
    StartOver { at: Offset },
}

/// What replay does to the log: append item `i` (a batch), cut the log
/// back to end at an offset (`Log::truncate_to`), or empty it and start
/// again at one (`Log::start_over_at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Append(usize),
    Truncate(Offset),
    StartOver(Offset),
}

/// The actions that bring a log ending at `log_end` to the state its
/// journal items describe (see the module doc). A batch that starts past
/// the log's end is skipped only if a later truncation cuts the log to
/// its end or below (its records were cut in the journal's history too,
/// and the segment lost them with that cut); otherwise records are
/// missing, an error.
pub fn replay_actions(mut log_end: Offset, items: &[Item]) -> Result<Vec<Action>, String> {
    // The lowest cut after each item (a start-over discards everything
    // before it, as a cut to 0 would).
    let mut cut_after = vec![None; items.len()];
    let mut lowest: Option<Offset> = None;
    for (i, item) in items.iter().enumerate().rev() {
        cut_after[i] = lowest;
        match item {
            Item::Cut { to } => lowest = Some(lowest.map_or(*to, |l| l.min(*to))),
            Item::StartOver { .. } => lowest = Some(Offset(0)),
            Item::Batch { .. } => {}
        }
    }
    let mut actions = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match *item {
            Item::Batch { base, next } if base == log_end => {
                actions.push(Action::Append(i));
                log_end = next;
            }
            // Already there, or cut by a later truncation.
            Item::Batch { base, .. } if base < log_end => {}
            Item::Batch { base, .. } => {
                if cut_after[i].is_none_or(|cut| cut > log_end) {
                    return Err(format!(
                        "the log ends at offset {log_end} but the journal's next batch starts at {base}: records are \
                         missing"
                    ));
                }
            }
            Item::Cut { to } if to < log_end => {
                actions.push(Action::Truncate(to));
                log_end = to;
            }
            Item::Cut { .. } => {}
            // A follower starts over only past its log's end; a log that
            // ends there or later holds what came after.
            Item::StartOver { at } if log_end < at => {
                actions.push(Action::StartOver(at));
                log_end = at;
            }
            Item::StartOver { .. } => {}
        }
    }
    Ok(actions)
}

/// A log's changes as replay items, with each batch's bytes (`None` for a
/// cut), in order.
pub fn items_of<'a>(changes: impl IntoIterator<Item = &'a Change>) -> (Vec<Item>, Vec<Option<Bytes>>) {
    let (mut items, mut bytes) = (Vec::new(), Vec::new());
    for change in changes {
        match change {
            Change::Batches { bytes: all, .. } => {
                for one in super::format::split_batches(all) {
                    let Some(header) = crate::batch::BatchHeader::parse(&one) else {
                        continue;
                    };
                    items.push(Item::Batch {
                        base: header.base_offset,
                        next: header.next_offset(),
                    });
                    bytes.push(Some(one));
                }
            }
            Change::Truncation { log_end } => {
                items.push(Item::Cut { to: *log_end });
                bytes.push(None);
            }
            Change::StartOver { at } => {
                items.push(Item::StartOver { at: *at });
                bytes.push(None);
            }
        }
    }
    (items, bytes)
}

/// One log's entries in a plan.
#[derive(Debug)]
pub struct LogEntries<'a> {
    pub dir: &'a str,
    pub log_id: u64,
    /// In journal order.
    pub changes: Vec<&'a Change>,
}

/// The entries of `plan` grouped by log (directory and id), logs in the
/// order of their first entry: one pass, however many logs.
pub fn by_log(plan: &Plan) -> Vec<LogEntries<'_>> {
    let mut at: std::collections::HashMap<(&str, u64), usize> = std::collections::HashMap::new();
    let mut logs: Vec<LogEntries<'_>> = Vec::new();
    for (_, e) in &plan.entries {
        let i = *at.entry((e.dir.as_str(), e.log_id)).or_insert_with(|| {
            logs.push(LogEntries {
                dir: &e.dir,
                log_id: e.log_id,
                changes: Vec::new(),
            });
            logs.len() - 1
        });
        logs[i].changes.push(&e.change);
    }
    logs
}
