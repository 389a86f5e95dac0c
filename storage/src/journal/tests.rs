use std::time::Duration;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::format::*;
use super::recover::*;
use super::*;
use crate::testkit::{batch, run_within, stamp_at};
use crate::Offset;

/// `n` batches of `records` records each, stamped from offset `base` on,
/// back to back.
fn batches(base: u64, n: u32, records: u32) -> Bytes {
    let mut out = BytesMut::new();
    let mut next = base;
    for i in 0..n {
        let rb = stamp_at(batch(next * 31 + u64::from(i), records, 20, 1_000), next);
        next = rb.next_offset().0;
        out.extend_from_slice(rb.bytes());
    }
    out.freeze()
}

fn batches_entry(dir: &str, log_id: u64, base: u64, n: u32) -> Entry {
    Entry {
        dir: dir.into(),
        log_id,
        change: Change::Batches {
            base: Offset(base),
            bytes: batches(base, n, 2),
        },
    }
}

fn frame_bytes(header: FrameHeader, entries: &[Entry]) -> Vec<u8> {
    let mut gathered = Vec::new();
    for e in entries {
        let before = gathered.len();
        encode_entry(&mut gathered, &e.dir, e.log_id, &e.change);
        assert_eq!(gathered.len() - before, entry_len(&e.dir, &e.change));
    }
    encode_frame(header, entries.len() as u32, &gathered)
}

fn header(file_seq: u64, lsn: u64, replay_from: u64) -> FrameHeader {
    FrameHeader {
        file_seq,
        lsn,
        replay_from,
    }
}

/// A file image: its header, then `frames` (each already padded).
fn file_image(seq: u64, first_lsn: u64, frames: &[Vec<u8>]) -> Bytes {
    let mut out = encode_file_header(FileHeader { seq, first_lsn });
    for f in frames {
        out.extend_from_slice(f);
    }
    Bytes::from(out)
}

#[test]
fn a_frame_decodes_to_what_was_encoded() {
    let entries = vec![
        batches_entry("orders/0", 7, 0, 3),
        Entry {
            dir: "orders/1".into(),
            log_id: 8,
            change: Change::Truncation { log_end: Offset(42) },
        },
        batches_entry("payments.dlq/12", u64::MAX, 1_000, 1),
        Entry {
            dir: "orders/2".into(),
            log_id: 9,
            change: Change::StartOver { at: Offset(1 << 40) },
        },
    ];
    let bytes = frame_bytes(header(3, 10, 9), &entries);
    assert_eq!(bytes.len() % BLOCK, 0);
    let frame = decode_frame(&Bytes::from(bytes.clone()), 3, 10).unwrap();
    assert_eq!(frame.header, header(3, 10, 9));
    assert_eq!(frame.entries, entries);
    assert_eq!(frame.disk_len, bytes.len());
    let split = match &frame.entries[0].change {
        Change::Batches { bytes, .. } => split_batches(bytes),
        other => panic!("{other:?}"),
    };
    assert_eq!(split.len(), 3);
    let file = encode_file_header(FileHeader { seq: 5, first_lsn: 77 });
    assert_eq!(decode_file_header(&file), Ok(FileHeader { seq: 5, first_lsn: 77 }));
}

#[test]
fn a_frame_of_another_file_or_turn_reads_as_stale() {
    let bytes = Bytes::from(frame_bytes(header(3, 10, 10), &[batches_entry("q/0", 1, 0, 1)]));
    assert!(matches!(
        decode_frame(&bytes, 4, 10),
        Err(FrameError::Stale { file_seq: 3, .. })
    ));
    assert!(matches!(
        decode_frame(&bytes, 3, 11),
        Err(FrameError::Stale { lsn: 10, .. })
    ));
    assert_eq!(
        decode_frame(&Bytes::from(vec![0u8; BLOCK]), 3, 10),
        Err(FrameError::Zero)
    );
}

#[test]
fn every_single_byte_change_and_every_cut_of_a_frame_is_caught() {
    let entries = vec![batches_entry("q/0", 1, 5, 2), batches_entry("q/1", 2, 0, 1)];
    let good = frame_bytes(header(1, 4, 2), &entries);
    let used = FRAME_HEADER_LEN + entries.iter().map(|e| entry_len(&e.dir, &e.change)).sum::<usize>();
    for at in 0..used {
        let mut bad = good.clone();
        bad[at] ^= 0x20;
        match decode_frame(&Bytes::from(bad), 1, 4) {
            Ok(f) => panic!("a flipped byte {at} decoded: {f:?}"),
            Err(FrameError::Zero) => panic!("byte {at}: a written frame read as never written"),
            Err(_) => {}
        }
    }
    for cut in 0..used {
        let short = Bytes::copy_from_slice(&good[..cut]);
        assert!(decode_frame(&short, 1, 4).is_err(), "cut at {cut} decoded");
    }
}

#[test]
fn entries_that_do_not_check_out_are_refused_when_encoded_into_a_valid_frame() {
    // A frame whose CRC is right but whose contents are not: a bad
    // directory, batches out of order, an unknown kind.
    let mut bad_dir = Vec::new();
    encode_entry(&mut bad_dir, "../etc", 1, &Change::Truncation { log_end: Offset(1) });
    let mut gap = Vec::new();
    let mut two = batches(0, 1, 2).to_vec();
    two.extend_from_slice(&batches(5, 1, 2));
    encode_entry(
        &mut gap,
        "q/0",
        1,
        &Change::Batches {
            base: Offset(0),
            bytes: Bytes::from(two),
        },
    );
    let mut kind = Vec::new();
    encode_entry(&mut kind, "q/0", 1, &Change::Truncation { log_end: Offset(1) });
    kind[0] = 9;
    for gathered in [bad_dir, gap, kind] {
        let frame = encode_frame(header(0, 0, 0), 1, &gathered);
        assert!(
            matches!(decode_frame(&Bytes::from(frame), 0, 0), Err(FrameError::Corrupt(_))),
            "decoded"
        );
    }
    assert!(check_dir("a/./b").is_err() && check_dir("/abs").is_err() && check_dir("").is_err());
    assert!(check_dir("orders/3").is_ok());
}

#[test]
fn a_file_scan_stops_at_zeros_stale_frames_and_torn_ones() {
    let f0 = frame_bytes(header(2, 10, 10), &[batches_entry("q/0", 1, 0, 1)]);
    let f1 = frame_bytes(header(2, 11, 10), &[batches_entry("q/0", 1, 2, 1)]);
    let stale = frame_bytes(header(1, 3, 0), &[batches_entry("q/0", 1, 9, 1)]);
    let scan = scan_file(&file_image(2, 10, &[f0.clone(), f1.clone(), vec![0; BLOCK]])).unwrap();
    assert_eq!((scan.frames.len(), &scan.end), (2, &FileEnd::Clean));
    assert_eq!(scan.valid_end as usize, FILE_HEADER_LEN + f0.len() + f1.len());
    let scan = scan_file(&file_image(2, 10, &[f0.clone(), stale])).unwrap();
    assert_eq!((scan.frames.len(), &scan.end), (1, &FileEnd::Stale));
    let mut torn = f1.clone();
    torn[FRAME_HEADER_LEN + 5] ^= 1;
    let scan = scan_file(&file_image(2, 10, &[f0, torn])).unwrap();
    assert_eq!(scan.frames.len(), 1);
    assert!(matches!(scan.end, FileEnd::Damaged { lsn: 11, .. }), "{:?}", scan.end);
    assert!(scan_file(&Bytes::from(vec![0u8; BLOCK])).is_err());
}

/// The changes `plan` holds for one log, in order.
fn entries_of<'a>(plan: &'a Plan, dir: &str, log_id: u64) -> Vec<&'a Change> {
    by_log(plan)
        .into_iter()
        .find(|l| l.dir == dir && l.log_id == log_id)
        .map_or_else(Vec::new, |l| l.changes)
}

fn scanned(seq: u64, first_lsn: u64, frames: &[Vec<u8>]) -> (String, FileScan) {
    (
        format!("file-{seq}"),
        scan_file(&file_image(seq, first_lsn, frames)).unwrap(),
    )
}

#[test]
fn recovery_replays_from_the_newest_frames_replay_from() {
    let a = scanned(
        0,
        0,
        &[
            frame_bytes(header(0, 0, 0), &[batches_entry("q/0", 1, 0, 1)]),
            frame_bytes(header(0, 1, 0), &[batches_entry("q/0", 1, 2, 1)]),
        ],
    );
    let b = scanned(
        1,
        2,
        &[
            frame_bytes(header(1, 2, 1), &[batches_entry("q/1", 2, 0, 1)]),
            frame_bytes(header(1, 3, 1), &[batches_entry("q/0", 1, 4, 1)]),
        ],
    );
    let plan = plan(&[b.clone(), a.clone()]).unwrap();
    assert_eq!((plan.replay_from, plan.next_lsn, plan.next_file_seq), (1, 4, 2));
    assert_eq!(
        plan.entries.iter().map(|(lsn, _)| *lsn).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let of_q0 = entries_of(&plan, "q/0", 1);
    assert_eq!(of_q0.len(), 2);
    assert_eq!(
        entries_of(&plan, "q/0", 99).len(),
        0,
        "another log in the same directory"
    );
    // Without the first file, frame 1 is missing.
    let err = super::recover::plan(&[b]).unwrap_err();
    assert!(err.contains("frame 1 is missing"), "{err}");
}

#[test]
fn a_damaged_frame_that_later_frames_follow_fails_recovery_unless_a_restart_took_over() {
    let f0 = frame_bytes(header(0, 0, 0), &[batches_entry("q/0", 1, 0, 1)]);
    let mut torn = frame_bytes(header(0, 1, 0), &[batches_entry("q/0", 1, 2, 1)]);
    torn[FRAME_HEADER_LEN + 3] ^= 0xff;
    let a = scanned(0, 0, &[f0, torn]);
    // The writer went on in file 1 from frame 2: frame 1 was acknowledged.
    let went_on = scanned(1, 2, &[frame_bytes(header(1, 2, 0), &[batches_entry("q/0", 1, 4, 1)])]);
    let err = plan(&[a.clone(), went_on]).unwrap_err();
    assert!(err.contains("frame 1 is damaged"), "{err}");
    // A restart after the crash started file 1 at frame 1: the torn one
    // was never acknowledged.
    let restarted = scanned(1, 1, &[frame_bytes(header(1, 1, 0), &[batches_entry("q/0", 1, 2, 1)])]);
    let plan = plan(&[a, restarted]).unwrap();
    assert_eq!(plan.next_lsn, 2);
    assert_eq!(plan.entries.len(), 2);
}

#[test]
fn replay_appends_at_the_end_skips_what_is_there_and_refuses_a_gap() {
    let batch = |base, next| Item::Batch {
        base: Offset(base),
        next: Offset(next),
    };
    let items = [batch(0, 3), batch(3, 5), Item::Cut { to: Offset(4) }, batch(4, 6)];
    // The segment holds offsets 0..3: append from the second batch on.
    assert_eq!(
        replay_actions(Offset(3), &items).unwrap(),
        vec![Action::Append(1), Action::Truncate(Offset(4)), Action::Append(3)]
    );
    // It holds the final state already (0..6): the cut to 4 is repeated,
    // and what it cut comes back from the journal.
    assert_eq!(
        replay_actions(Offset(6), &items).unwrap(),
        vec![Action::Truncate(Offset(4)), Action::Append(3)]
    );
    // It holds less than the journal starts from and nothing cuts back
    // to it: records are missing.
    let err = replay_actions(Offset(2), &items[1..2]).unwrap_err();
    assert!(err.contains("missing"), "{err}");
    // ... unless a later cut goes below where it ends.
    assert_eq!(
        replay_actions(Offset(2), &[batch(3, 5), Item::Cut { to: Offset(1) }, batch(1, 2)]).unwrap(),
        vec![Action::Truncate(Offset(1)), Action::Append(2)]
    );
}

#[test]
fn a_logs_changes_become_items_batch_by_batch() {
    let changes = [batches_change(0, 3), Change::Truncation { log_end: Offset(2) }];
    let (items, bytes) = items_of(&changes);
    assert_eq!(items.len(), 4);
    assert_eq!(
        items[1],
        Item::Batch {
            base: Offset(2),
            next: Offset(4)
        }
    );
    assert_eq!(items[3], Item::Cut { to: Offset(2) });
    let (items, _) = items_of(&[Change::StartOver { at: Offset(9) }]);
    assert_eq!(items, vec![Item::StartOver { at: Offset(9) }]);
    assert!(bytes[..3].iter().all(Option::is_some) && bytes[3].is_none());
}

/// A history of one log: appends of batches of 1..=3 offsets (each offset
/// holding the index of its op), truncations below the end (to the log
/// start or below: the log starts over there, as `Log::truncate_to` does)
/// and start-overs past the end.
#[derive(Debug, Clone, Copy)]
enum Op {
    Append { base: u64, len: u64 },
    Truncate(u64),
    StartOver(u64),
}

fn item(op: &Op) -> Item {
    match *op {
        Op::Append { base, len } => Item::Batch {
            base: Offset(base),
            next: Offset(base + len),
        },
        Op::Truncate(to) => Item::Cut { to: Offset(to) },
        Op::StartOver(at) => Item::StartOver { at: Offset(at) },
    }
}

/// A model log: its start and what each offset from there holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Model {
    start: u64,
    held: Vec<usize>,
}

impl Model {
    fn end(&self) -> u64 {
        self.start + self.held.len() as u64
    }
    fn truncate(&mut self, to: u64) {
        if to <= self.start {
            *self = Model {
                start: to,
                held: Vec::new(),
            };
        } else {
            self.held.truncate((to - self.start) as usize);
        }
    }
}

proptest! {
    /// Whatever the segment holds after a crash — the state at some point
    /// after replay-from, cut back to anything that keeps what was durable
    /// at replay-from and not truncated since — replaying the journal from
    /// replay-from ends in the journal's final state.
    #[test]
    fn replay_from_any_durable_point_ends_in_the_final_state(
        raw in proptest::collection::vec((0u8..7, any::<u8>()), 1..40),
        from_pick in any::<usize>(),
        upto_pick in any::<usize>(),
        cut_pick in any::<usize>(),
    ) {
        // A valid history; `states[i]` is the log after `ops[..i]`.
        let mut ops: Vec<Op> = Vec::new();
        let mut state = Model { start: 0, held: Vec::new() };
        let mut states = vec![state.clone()];
        for (i, (kind, n)) in raw.iter().enumerate() {
            let end = state.end();
            let op = match kind {
                0 | 1 if end > 0 => Op::Truncate(u64::from(*n) % end),
                2 => Op::StartOver(end + 1 + u64::from(*n % 4)),
                _ => Op::Append { base: end, len: u64::from(*n % 3) + 1 },
            };
            match op {
                Op::Append { len, .. } => state.held.extend(std::iter::repeat_n(i, len as usize)),
                Op::Truncate(to) => state.truncate(to),
                Op::StartOver(at) => state = Model { start: at, held: Vec::new() },
            }
            ops.push(op);
            states.push(state.clone());
        }
        let from = from_pick % (ops.len() + 1);
        let upto = from + upto_pick % (ops.len() + 1 - from);
        let (at_from, at_upto) = (&states[from], &states[upto]);
        // What was durable at `from` and is still there at `upto`.
        let common = if at_from.start == at_upto.start {
            at_from.held.iter().zip(&at_upto.held).take_while(|(a, b)| a == b).count()
        } else {
            0
        };
        // Batches are whole on disk: cut only at a batch boundary.
        let held = &at_upto.held;
        let boundaries: Vec<usize> = (common..=held.len())
            .filter(|&b| b == 0 || b == held.len() || held[b - 1] != held[b])
            .collect();
        let cut = boundaries[cut_pick % boundaries.len()];
        let mut segment = Model { start: at_upto.start, held: held[..cut].to_vec() };
        let items: Vec<Item> = ops[from..].iter().map(item).collect();
        let actions = replay_actions(Offset(segment.end()), &items).map_err(TestCaseError::fail)?;
        for action in actions {
            match action {
                Action::Append(i) => match ops[from + i] {
                    Op::Append { base, len } => {
                        prop_assert_eq!(base, segment.end());
                        segment.held.extend(std::iter::repeat_n(from + i, len as usize));
                    }
                    other => prop_assert!(false, "appending {:?}", other),
                },
                Action::Truncate(to) => segment.truncate(to.0),
                Action::StartOver(at) => segment = Model { start: at.0, held: Vec::new() },
            }
        }
        prop_assert_eq!(&segment, &state);
    }
}

fn run<T: Send + 'static, Fut: std::future::Future<Output = T> + 'static>(
    f: impl FnOnce() -> Fut + Send + 'static,
) -> T {
    run_within(Duration::from_secs(60), f)
}

fn small() -> JournalConfig {
    JournalConfig {
        file_bytes: 1 << 20,
        spare_files: 2,
        checkpoint_ms: 100,
        ..JournalConfig::default()
    }
}

fn batches_change(base: u64, n: u32) -> Change {
    Change::Batches {
        base: Offset(base),
        bytes: batches(base, n, 2),
    }
}

/// About 70 KB of batches: the `i`th of a log's big appends.
fn big_change(i: u64) -> Change {
    Change::Batches {
        base: Offset(i * 2_000),
        bytes: batches(i * 2_000, 10, 200),
    }
}

#[test]
fn what_was_waited_for_is_replayed_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (journal, plan, replay_pin) = Journal::open(&path, small()).await.unwrap();
        assert!(plan.entries.is_empty());
        drop(replay_pin);
        let a = journal.add("q/0", 1, &batches_change(0, 2)).unwrap();
        let b = journal.add("q/1", 2, &batches_change(0, 1)).unwrap();
        assert_eq!(a, b, "gathered into one frame");
        let pin = journal.pin(a);
        journal.wait(a).await.unwrap();
        let c = journal
            .add("q/0", 1, &Change::Truncation { log_end: Offset(1) })
            .unwrap();
        assert_eq!(c, a + 1);
        journal.wait(c).await.unwrap();
        assert_eq!(journal.stats().frames, 2);
        drop(pin);
        drop(journal);
        let (_journal, plan, _pin) = Journal::open(&path, small()).await.unwrap();
        assert_eq!(plan.replay_from, a);
        assert_eq!(plan.next_lsn, c + 1);
        let changes: Vec<Change> = entries_of(&plan, "q/0", 1).into_iter().cloned().collect();
        assert_eq!(
            changes,
            vec![batches_change(0, 2), Change::Truncation { log_end: Offset(1) }]
        );
        assert_eq!(entries_of(&plan, "q/1", 2).len(), 1);
    });
}

#[test]
fn unpinned_frames_are_not_replayed_and_their_files_are_written_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (journal, _, replay_pin) = Journal::open(&path, small()).await.unwrap();
        drop(replay_pin);
        // ~70 KB frames: a 1 MiB file takes about 14; write 100 of them,
        // pinning only the last few.
        let mut last = 0;
        let mut pins = VecDeque::new();
        for i in 0..100u64 {
            let lsn = journal.add("q/0", 1, &big_change(i)).unwrap();
            pins.push_back(journal.pin(lsn));
            if pins.len() > 3 {
                pins.pop_front();
            }
            journal.wait(lsn).await.unwrap();
            last = lsn;
        }
        let stats = journal.stats();
        assert!(stats.files_started >= 6, "{stats:?}");
        assert!(stats.files_recycled >= 3, "{stats:?}");
        assert!(journal.files_in_use() <= 2, "{}", journal.files_in_use());
        let on_disk = std::fs::read_dir(&path).unwrap().count();
        assert!(on_disk <= 2 + 2 + 1, "{on_disk} files");
        let oldest = pins.front().unwrap().lsn();
        drop(journal);
        let (_j, plan, _pin) = Journal::open(&path, small()).await.unwrap();
        assert_eq!(plan.replay_from, oldest);
        assert_eq!(plan.next_lsn, last + 1);
        assert_eq!(plan.entries.len() as u64, last + 1 - oldest);
    });
}

#[test]
fn a_torn_last_frame_is_dropped_and_the_next_start_goes_on_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (journal, _, replay_pin) = Journal::open(&path, small()).await.unwrap();
        let a = journal.add("q/0", 1, &batches_change(0, 1)).unwrap();
        journal.wait(a).await.unwrap();
        let b = journal.add("q/0", 1, &batches_change(1, 1)).unwrap();
        journal.wait(b).await.unwrap();
        drop((journal, replay_pin));
        // Tear frame b: flip a byte of its entries.
        let file = std::fs::read_dir(&path).unwrap().next().unwrap().unwrap().path();
        let mut image = std::fs::read(&file).unwrap();
        let frame_a = decode_frame(&Bytes::from(image[FILE_HEADER_LEN..].to_vec()), 0, a).unwrap();
        let at = FILE_HEADER_LEN + frame_a.disk_len + FRAME_HEADER_LEN + 2;
        image[at] ^= 0x55;
        std::fs::write(&file, &image).unwrap();
        let (journal, plan, replay_pin) = Journal::open(&path, small()).await.unwrap();
        assert_eq!((plan.replay_from, plan.next_lsn), (a, b), "frame b is gone");
        let c = journal.add("q/0", 1, &batches_change(1, 1)).unwrap();
        assert_eq!(c, b);
        journal.wait(c).await.unwrap();
        drop((journal, replay_pin));
        // The torn frame in the first file does not fail the next recovery:
        // the second file took over from it.
        let (_j, plan, _pin) = Journal::open(&path, small()).await.unwrap();
        assert_eq!(plan.next_lsn, c + 1);
        assert_eq!(plan.entries.len(), 2);
    });
}

#[test]
fn a_missing_needed_file_fails_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (journal, _, pin) = Journal::open(&path, small()).await.unwrap();
        for i in 0..40u64 {
            let lsn = journal.add("q/0", 1, &big_change(i)).unwrap();
            journal.wait(lsn).await.unwrap();
        }
        // `pin` (from the open) holds frame 0: every file is needed.
        drop((journal, pin));
        let mut files: Vec<_> = std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        assert!(files.len() >= 3);
        std::fs::remove_file(&files[1]).unwrap();
        match Journal::open(&path, small()).await {
            Err(StorageError::CorruptJournal { reason, .. }) => assert!(reason.contains("missing"), "{reason}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("opened without a needed file"),
        }
    });
}

#[test]
fn a_prepared_spare_is_zero_filled_then_written_over_and_a_reopen_takes_it_as_spare() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (journal, _, replay_pin) = Journal::open(&path, small()).await.unwrap();
        drop(replay_pin);
        assert!(journal.prepare_spare().await.unwrap());
        assert!(!journal.prepare_spare().await.unwrap(), "one spare is enough");
        let prepared: Vec<_> = std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(prepared.len(), 1);
        let image = std::fs::read(&prepared[0]).unwrap();
        assert_eq!(image.len() as u64, small().file_bytes);
        assert!(image.iter().all(|&b| b == 0));
        // The first frame's file is the prepared one, renamed.
        let lsn = journal.add("q/0", 1, &batches_change(0, 2)).unwrap();
        let pin = journal.pin(lsn);
        journal.wait(lsn).await.unwrap();
        let stats = journal.stats();
        assert_eq!(
            (stats.files_started, stats.files_recycled, stats.files_prepared),
            (1, 1, 1)
        );
        assert!(!prepared[0].exists());
        // A spare prepared and never used reads as a spare after a reopen.
        assert!(journal.prepare_spare().await.unwrap());
        drop(pin);
        drop(journal);
        let (journal, plan, _pin) = Journal::open(&path, small()).await.unwrap();
        assert_eq!(plan.entries.len(), 1);
        assert!(
            !journal.prepare_spare().await.unwrap(),
            "the reopened journal has its spare"
        );
        let lsn = journal.add("q/0", 1, &batches_change(2, 1)).unwrap();
        journal.wait(lsn).await.unwrap();
        assert_eq!(journal.stats().files_recycled, 1);
    });
}

#[test]
fn after_a_frame_of_several_entries_the_next_waits_for_as_many_or_the_spacing_and_after_a_lone_one_it_goes_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let spacing = Duration::from_secs(1);
        let config = JournalConfig {
            frame_spacing_us: spacing.as_micros() as u64,
            ..small()
        };
        let (journal, _, replay_pin) = Journal::open(&path, config).await.unwrap();
        drop(replay_pin);
        let a = journal.add("q/0", 1, &batches_change(0, 1)).unwrap();
        assert_eq!(journal.add("q/1", 2, &batches_change(0, 1)).unwrap(), a);
        journal.wait(a).await.unwrap();
        // Frame `a` carried two entries: the next waits for a second one
        // (arriving 100 ms later, as a client answered by `a` sends
        // again) and goes as soon as it is in, both in it.
        let started = std::time::Instant::now();
        let b = journal.add("q/0", 1, &batches_change(1, 1)).unwrap();
        let other = journal.clone();
        let second = glommio::spawn_local(async move {
            glommio::timer::sleep(Duration::from_millis(100)).await;
            let lsn = other.add("q/1", 2, &batches_change(1, 1)).unwrap();
            other.wait(lsn).await.unwrap();
            lsn
        });
        journal.wait(b).await.unwrap();
        assert_eq!(second.await, b, "gathered while the frame waited");
        assert!(
            started.elapsed() >= Duration::from_millis(100),
            "{:?}",
            started.elapsed()
        );
        assert!(started.elapsed() < spacing / 2, "{:?}", started.elapsed());
        // Frame `b` carried two as well; a lone entry after it waits out
        // the spacing (no second comes) ...
        let lone = std::time::Instant::now();
        let c = journal.add("q/0", 1, &batches_change(2, 1)).unwrap();
        journal.wait(c).await.unwrap();
        assert!(lone.elapsed() >= spacing / 2, "{:?}", lone.elapsed());
        // ... and the frame after that lone one goes at once.
        let at_once = std::time::Instant::now();
        let d = journal.add("q/0", 1, &batches_change(3, 1)).unwrap();
        journal.wait(d).await.unwrap();
        assert!(at_once.elapsed() < spacing / 2, "{:?}", at_once.elapsed());
        let stats = journal.stats();
        assert_eq!((stats.frames, stats.entries), (4, 6));
    });
}

#[test]
fn appends_runnable_together_share_one_frame_when_the_first_of_them_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (journal, _, replay_pin) = Journal::open(&path, small()).await.unwrap();
        drop(replay_pin);
        // A produce request's partitions, a task each, spawned together:
        // the first to run adds and writes, the rest have not added yet.
        let tasks: Vec<_> = (0..5u64)
            .map(|i| {
                let journal = journal.clone();
                glommio::spawn_local(async move {
                    let lsn = journal.add(&format!("q/{i}"), i, &batches_change(0, 1)).unwrap();
                    journal.wait(lsn).await.unwrap();
                    lsn
                })
            })
            .collect();
        let mut lsns = Vec::new();
        for t in tasks {
            lsns.push(t.await);
        }
        assert!(lsns.windows(2).all(|w| w[0] == w[1]), "one frame: {lsns:?}");
        let stats = journal.stats();
        assert_eq!((stats.frames, stats.entries), (1, 5));
    });
}

#[test]
fn a_stopped_journal_refuses_adds_and_waits_and_returns_only_once_no_write_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (journal, _, replay_pin) = Journal::open(&path, small()).await.unwrap();
        drop(replay_pin);
        let lsn = journal.add("q/0", 1, &batches_change(0, 1)).unwrap();
        // A frame write in flight when the journal is stopped.
        let writer = journal.clone();
        let write = glommio::spawn_local(async move { writer.wait(lsn).await });
        // (It takes the write lock, yields once, and is in its write.)
        super::yield_once().await;
        super::yield_once().await;
        journal.stop("restarting").await;
        assert!(journal.failed().is_some_and(|why| why == "restarting"));
        // The write in flight had ended when stop returned: the frame is
        // counted, and its waiter is refused all the same.
        assert_eq!(journal.stats().frames, 1);
        assert!(write.await.is_err());
        assert!(journal.add("q/0", 1, &batches_change(1, 1)).is_err(), "adds refused");
        assert!(journal.wait(journal.durable_lsn()).await.is_err(), "waits refused");
        assert!(journal.checkpoint().await.is_err(), "no frame after it");
        let frames = journal.stats().frames;
        glommio::timer::sleep(Duration::from_millis(20)).await;
        assert_eq!(journal.stats().frames, frames, "nothing written after stop");
        // A frame write failure stays the reason: stop does not replace it.
        journal.stop("again").await;
        assert_eq!(journal.failed().as_deref(), Some("restarting"));
    });
}
