//! `strand-net`: how Strand messages travel on a TCP stream.
//!
//! Sans-I/O: everything here works on byte buffers, so the broker (on
//! glommio) and the client (on any runtime, or plain threads) share it.
//!
//! - [`frame`]: the frame layout, byte by byte, a streaming decoder with
//!   limits, and the encoder.
//! - [`message`]: reading a frame's flatbuffer body as the table its API
//!   calls for (verified), slicing record batches out of its raw tail, and
//!   building bodies.
//! - [`scram`]: SASL SCRAM-SHA-256/512, both sides of the exchange.

pub mod frame;
pub mod fuzzing;
pub mod message;
pub mod scram;

pub use frame::{Frame, FrameError, FrameHeader, FrameLimits, FrameMut};
pub use message::{MessageError, OutFrame};
